"""An NPU replay job's msprof session: wrap the replay child, then turn op_summary rows into row outcomes.

The replay child (`opperf.replay.worker`, started by `opperf.replay.isolation`) builds each row's
call, runs it once and verifies its outputs, then runs the warm-up and `repeat_count` measured calls;
on the NPU its outcome is `executed` (verified, no numbers yet). This module wraps that child in
one msprof session per attempt (`wrap_command`), and afterwards (`resolve_outcomes`) reads the
session's op_summary, keeps the last `repeat_count` samples of each (OP Type, signature) group, and
turns every `executed` outcome into `ok` with the durations and `MicroBench <counter>` columns, or
into `failed_no_samples` when the profiler saw no kernel of the row's Type(s) with its signature.

`backfill_database` is the seed's `start_microbench --prof-path`: an existing PROF_* directory is
written back into every `{OP Type}.csv` of a database directory, by signature.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import read_database_csv, write_csv_atomic
from opperf.log import get_logger, utc_timestamp
from opperf.replay.engine import (STATUS_EXECUTED, STATUS_FAILED_NO_SAMPLES, STATUS_OK, UPDATE_MODES, RowOutcome,
                                  replay_key)
from opperf.replay.npu import msprof, op_summary
from opperf.replay.writeback import WritebackReport, write_back

log = get_logger("replay.npu.session")
WORKER_MODULE = "opperf.replay.worker"


@dataclass
class MsprofSession:
    """The profiler side of one NPU replay job: where sessions write, and how the child is wrapped.

    `profiler="msprof"` (default): msprof around the child. `profiler="torch_npu"`: the alternative
    timer, torch_npu.profiler inside the child (kernel_details.csv instead of op_summary).
    """

    output_root: Path
    msprof_executable: str = "msprof"
    aic_metrics: str | None = None
    execution_mode: str = "inprocess"
    torchrun: msprof.TorchrunOptions | None = None     # DispatchFFNCombine: one process per EP rank
    profiler: str = "msprof"
    attempts: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.profiler not in msprof.PROFILERS:
            raise OpperfError(f"NPU profiler {self.profiler!r} is not one of {msprof.PROFILERS}", field="profiler")

    def wrap_command(self, command: list[str], attempt: int) -> list[str]:
        """`isolation.run_isolated`'s hook: `python -m opperf.replay.worker ARGS` → msprof around the entry.

        Each attempt (a restart after a crash) is its own session under `output_root/attempt_<n>`.
        """
        try:
            position = command.index(WORKER_MODULE)
        except ValueError:
            raise OpperfError(f"cannot wrap {command[:3]}...: expected `python -m {WORKER_MODULE} ...`") from None
        if position < 2 or command[position - 1] != "-m":
            raise OpperfError(f"cannot wrap {command[:3]}...: expected `python -m {WORKER_MODULE} ...`")
        python, worker_args = command[0], command[position + 1:]
        output_dir = Path(self.output_root) / f"attempt_{attempt}"
        output_dir.mkdir(parents=True, exist_ok=True)
        self.attempts.append(output_dir)
        if self.profiler == "torch_npu":
            return msprof.entry_command(worker_args, execution_mode=self.execution_mode, torchrun=self.torchrun,
                                        python=python, profiler_options=["--profiler", "torch_npu",
                                                                         "--profiler-output", str(output_dir)])
        program = msprof.entry_command(worker_args, execution_mode=self.execution_mode, torchrun=self.torchrun,
                                       python=python)
        return msprof.msprof_command(output_dir, program, msprof=self.msprof_executable,
                                     aic_metrics=self.aic_metrics)

    def summaries(self) -> list[Path]:
        """The profiler tables of every session this job ran (op_summary, exported where msprof left none;
        or torch_npu.profiler's kernel_details). Empty when no session wrote anything (no row reached the
        device): `resolve_outcomes` then records why on every executed row."""
        root = Path(self.output_root)
        if self.profiler == "torch_npu":
            return sorted(root.rglob("ASCEND_PROFILER_OUTPUT/kernel_details*.csv")) if root.is_dir() else []
        if not root.is_dir() or not msprof.find_prof_dirs(root):
            return []
        return msprof.collect_op_summaries(root, msprof=self.msprof_executable)


def resolve_outcomes(outcomes: Mapping[tuple[str, ...], RowOutcome], summary_files: Sequence[Path], *,
                     kernel_types: Sequence[str], kernel_type: str,
                     repeat_count: int) -> dict[tuple[str, ...], RowOutcome]:
    """`executed` outcomes (keyed by `engine.replay_key`) with the session's durations filled in.

    `kernel_types`: the Types the row's call may be reported as (the definition's own first, then its
    alternates: MatMulV2 rows replay as torch.mm and may come back as MatMulV3). The last
    `repeat_count` samples per device are the measured calls (a collective such as
    DispatchFFNCombine reports each call once per rank's device; all of them are kept).
    Other outcomes (failures, skips) pass through unchanged.
    """
    if not summary_files and any(o.status == STATUS_EXECUTED for o in outcomes.values()):
        log.warning("the profiler session left no op_summary / kernel_details table")
    tables = [op_summary.read_profiler_table(path) for path in summary_files]
    # The profiler knows no EP Size: DispatchFFNCombine samples are matched on the five columns,
    # the session having replayed exactly the key's EP Size.
    timings = op_summary.aggregate_tables(tables, keep_last=repeat_count, kernel_types=kernel_types)
    resolved: dict[tuple[str, ...], RowOutcome] = {}
    for key, outcome in outcomes.items():
        if outcome.status != STATUS_EXECUTED:
            resolved[key] = outcome
            continue
        signature = contract.row_signature(dict(zip(contract.SIGNATURE_COLUMNS, key)), kernel_type)
        found = [(reported, timings[(reported, signature)]) for reported in kernel_types
                 if (reported, signature) in timings]
        if not found:
            seen = sorted({t for t, _ in timings})
            reason = ("the profiler session left no op_summary / kernel_details table (see the msprof log)"
                      if not summary_files else
                      f"the profiler session holds no {' / '.join(kernel_types)} task with signature "
                      f"{' | '.join(signature)} (Types seen: {', '.join(seen) or 'none'}); the call launched other "
                      "kernels than the profiled row")
            resolved[key] = RowOutcome(
                STATUS_FAILED_NO_SAMPLES, call=outcome.call, expected_outputs=outcome.expected_outputs,
                produced_outputs=outcome.produced_outputs, error=f"the call ran and verified, but {reason}",
                recipe=outcome.recipe)
            continue
        reported, timing = found[0]
        columns = timing.result_columns()
        if reported != kernel_type:
            columns[contract.REPLAY_TIMING_METHOD] += f" (reported as {reported})"
        resolved[key] = RowOutcome(STATUS_OK, columns=columns, call=outcome.call,
                                   expected_outputs=outcome.expected_outputs,
                                   produced_outputs=outcome.produced_outputs, recipe=outcome.recipe)
    return resolved


# --- --prof-path: an existing PROF_* directory written back into a database directory -----------

@dataclass
class BackfillResult:
    """What `backfill_database` did per CSV, for the report and the BACKFILL trace."""

    files: dict[str, WritebackReport] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)         # CSVs that did not exist (update mode all)
    unmatched: dict[str, int] = field(default_factory=dict)  # Type -> profiled groups matching no row
    summary_files: list[Path] = field(default_factory=list)


def _timing_row(timing: op_summary.SignatureTiming, collected_at: str) -> dict[str, str]:
    row = {column: timing.fields.get(column, "") for column in contract.BASE_COLUMNS}
    if contract.EP_SIZE in timing.fields:
        row[contract.EP_SIZE] = timing.fields[contract.EP_SIZE]
    row.update(timing.result_columns())
    row[contract.REPLAY_STATUS] = STATUS_OK
    row[contract.COLLECTED_AT] = collected_at
    return row


def backfill_database(database_dir: str | Path, prof_path: str | Path, *, kernel_types: Iterable[str] | None = None,
                      update_mode: str = "all", prune_empty_duration_rows: bool = False,
                      ep_size: int | None = None, msprof_executable: str | None = None,
                      collected_at: str | None = None) -> BackfillResult:
    """Write an existing profile's durations into `{OP Type}.csv` of `database_dir`, by signature.

    Every profiled group lands in the CSV of the Type the profiler reports. `all`: matching rows are
    updated and unmatched groups appended (a CSV is created for a Type without one); `missing-only`:
    only rows without a valid `Average Duration(us)` are filled and unmatched groups are reported, not
    appended. No row is dropped unless `prune_empty_duration_rows` is set.
    """
    if update_mode not in UPDATE_MODES:
        raise OpperfError(f"update mode {update_mode!r} is not one of {UPDATE_MODES}", field="--update-mode")
    database_dir = Path(database_dir)
    if not database_dir.is_dir():
        raise OpperfError("database directory not found", path=database_dir)
    collected_at = collected_at or utc_timestamp()
    result = BackfillResult(summary_files=msprof.collect_op_summaries(prof_path, msprof=msprof_executable))
    tables = [op_summary.read_profiler_table(path) for path in result.summary_files]
    timings = op_summary.aggregate_tables(tables, kernel_types=kernel_types, ep_size=ep_size)
    # Every CSV is read and updated before any is written: a bad Type or CSV leaves the database unchanged.
    pending: list[tuple[Path, pd.DataFrame, WritebackReport]] = []
    for kernel_type, by_signature in op_summary.timings_by_kernel_type(timings).items():
        contract.check_kernel_type(kernel_type, path=next(iter(by_signature.values())).sources[0], field="OP Type")
        path = database_dir / f"{kernel_type}.csv"
        if path.is_file():
            frame = read_database_csv(path, required=contract.SIGNATURE_COLUMNS)
        elif update_mode == "all":
            frame = pd.DataFrame(columns=list(contract.BASE_COLUMNS))
            result.created.append(kernel_type)
        else:
            result.unmatched[kernel_type] = len(by_signature)
            continue
        # Every matching row gets an outcome; write_back's missing-only leaves the rows already filled.
        outcomes: dict[tuple[str, ...], RowOutcome] = {}
        matched: set[contract.Signature] = set()
        for row in frame.to_dict(orient="records"):
            signature = contract.row_signature(row, kernel_type)
            if signature not in by_signature:
                continue
            matched.add(signature)
            key = replay_key(row, kernel_type)
            if key not in outcomes:
                outcomes[key] = RowOutcome(STATUS_OK, columns=by_signature[signature].result_columns())
        unmatched = [t for s, t in by_signature.items() if s not in matched]
        if unmatched:
            result.unmatched[kernel_type] = len(unmatched)
        appended = [_timing_row(t, collected_at) for t in unmatched] if update_mode == "all" else []
        updated, report = write_back(frame, kernel_type, outcomes, collected_at=collected_at,
                                     prune_empty_duration_rows=prune_empty_duration_rows, appended_rows=appended,
                                     update_mode=update_mode)
        pending.append((path, updated, report))
        result.files[kernel_type] = report
    for path, updated, report in pending:
        write_csv_atomic(path, updated)
        log.info("%s: %s", path, report.summary())
    return result
