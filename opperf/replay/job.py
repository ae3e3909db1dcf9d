"""One replay job: a kernel type's rows in, the same rows with replay results out (+ traces, reproducer).

    rows CSV ─ plan (distinct calls; missing-only skips filled rows)
             ─ device slot ─ isolated child processes (engine: build, verify, time)
             ─ [npu: the msprof session's per-signature durations]
             ─ write-back by signature ─ output CSV (atomic) + traces + reproducer
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from opperf import contract
from opperf.errors import OpperfError
from opperf.io import check_writable, read_database_csv, write_csv_atomic, write_text_atomic
from opperf.log import get_logger, span, utc_timestamp
from opperf.replay.definitions import (SCHEMA_BACKENDS, KernelDefinition, check_rows_fit, definition_for,
                                       load_definition, load_definitions, schema_definition)
from opperf.replay.engine import (DEFAULT_REPEAT_COUNT, DEFAULT_WARMUP_COUNT, FAILED_STATUSES, STATUS_FAILED_VERIFY,
                                  STATUS_NO_DEFINITION, STATUS_NOT_RUN, STATUS_OK, RowOutcome, WorkItem, plan_work)
from opperf.replay.isolation import WorkerSettings, run_isolated
from opperf.replay.methods import CACHE_POLICY, DEFAULT_HEATER_MIN_POWER_W, DEFAULT_MIN_REPEAT_COUNT, RepeatBudget
from opperf.replay.slots import DEFAULT_SLOTS_DIR, device_slot, visible_devices_env
from opperf.replay.writeback import INVALID_STATUSES, WritebackReport, outcomes_by_key, write_back
from opperf.trace import Trace
from opperf.versions import check_stack_matches

log = get_logger("replay.job")
TRACE_STEP = 4                        # the replay stage's number (docs/design.md, stages)
TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "templates"
REPRODUCER_TEMPLATE = "replay_reproducer.py.j2"


@dataclass
class ReplaySettings:
    """How to replay (everything but which rows): the CLI's and the config's `replay:` options."""

    backend: str = "cpu"
    repeat_count: int = DEFAULT_REPEAT_COUNT
    warmup_count: int = DEFAULT_WARMUP_COUNT
    update_mode: str = "all"
    timeout_s: float = 600.0
    max_restarts: int = 3
    prune_invalid_rows: bool = False
    prune_empty_duration_rows: bool = False
    fail_fast: bool = False
    # Replay in the device slot's persistent process (opperf.replay.server) instead of a child per job:
    # None = on for cuda (where torch import + profiler start-up cost ~10 s per process), off elsewhere.
    persistent_worker: bool | None = None

    def uses_server(self) -> bool:
        return self.backend == "cuda" if self.persistent_worker is None else self.persistent_worker
    heater_min_power_w: float = DEFAULT_HEATER_MIN_POWER_W
    unprofiled_power_w: float | None = None      # the power taken for rows without a profiled one
    memory_budget_bytes: int | None = None
    device_ids: Sequence[int] = ()
    slots_dir: str | Path = DEFAULT_SLOTS_DIR
    seed: int = 0
    cpu_threads: int | None = None
    # Timed calls per row chosen by time (methods.RepeatBudget), repeat_count the most; None: off.
    time_budget_s: float | None = None
    min_repeat_count: int = DEFAULT_MIN_REPEAT_COUNT

    def validate(self) -> None:
        if self.repeat_count < 1:
            raise OpperfError(f"must be >= 1, got {self.repeat_count}", field="--repeat-count")
        self.validate_budget()
        if self.warmup_count < 1:
            raise OpperfError(f"must be >= 1 (the first call is verified), got {self.warmup_count}",
                              field="--warmup-count")
        if self.timeout_s <= 0:
            raise OpperfError(f"must be > 0, got {self.timeout_s}", field="--timeout-s")
        if not 0 <= self.heater_min_power_w < float("inf"):
            raise OpperfError(f"must be a power in watts >= 0, got {self.heater_min_power_w}",
                              field="--heater-min-power")
        if self.unprofiled_power_w is not None and not 0 <= self.unprofiled_power_w < float("inf"):
            raise OpperfError(f"must be a power in watts >= 0, got {self.unprofiled_power_w}",
                              field="--unprofiled-power")

    def validate_budget(self) -> None:
        if self.min_repeat_count < 1:
            raise OpperfError(f"must be >= 1, got {self.min_repeat_count}", field="--min-repeat-count")
        if self.time_budget_s is None:
            return
        if not 0 < self.time_budget_s < float("inf"):
            raise OpperfError(f"must be a time in seconds > 0, got {self.time_budget_s}", field="--time-budget-s")
        if self.min_repeat_count > self.repeat_count:
            raise OpperfError(f"must be at most --repeat-count ({self.repeat_count}), the most timed calls a row "
                              f"gets, got {self.min_repeat_count}", field="--min-repeat-count")
        if self.backend == "npu":
            raise OpperfError("not supported on npu: the msprof session's samples are matched to rows by one count "
                              "of calls for all of them (--repeat-count)", field="--time-budget-s")

    def repeat_budget(self) -> RepeatBudget | None:
        """The budget that chooses each row's timed calls, None where every row gets repeat_count."""
        return (None if self.time_budget_s is None else
                RepeatBudget(self.time_budget_s, self.min_repeat_count))


@dataclass
class KernelJobResult:
    kernel_type: str
    items: list[WorkItem]
    outcomes: dict[tuple[str, ...], RowOutcome]       # by replay key
    writeback: WritebackReport
    trace_files: list[Path] = field(default_factory=list)

    def status_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for outcome in self.outcomes.values():
            counts[outcome.status] = counts.get(outcome.status, 0) + 1
        return dict(sorted(counts.items()))


def memory_budget_for(device_memory_gb: float, backend: str, fraction: float = 0.8) -> int:
    """Bytes a row's tensors may take: a fraction of device memory (cpu: also of this host's RAM)."""
    budget = device_memory_gb * 2**30 * fraction
    if backend == "cpu":
        try:
            host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            budget = min(budget, host * fraction)
        except (ValueError, OSError):
            pass
    if budget == float("inf"):
        raise OpperfError("no memory size to budget from (give --device)", field="--device")
    return int(budget)


def replay_rows(frame, kernel_type: str, definition: KernelDefinition | None, rows_path: str | Path,
                settings: ReplaySettings, *, session=None) -> tuple[list[WorkItem], dict[tuple[str, ...], RowOutcome]]:
    """Replay the distinct calls of `frame` (read from `rows_path`) in isolated children; outcomes by replay key.

    `session` (NPU): an `opperf.replay.npu.session.MsprofSession`; each child runs inside one msprof
    session, whose op_summary then gives the `executed` calls their durations.
    """
    rows = frame.to_dict(orient="records")
    items = plan_work(rows, kernel_type, settings.update_mode)
    if not items:
        return items, {}
    if definition is None:
        from opperf.coverage import load_not_replayed
        listed = load_not_replayed().get(settings.backend, {}).get(kernel_type)
        reason = (f"not replayed ({listed.reason}, config/not_replayed.yaml): {listed.detail}" if listed else
                  f"no kernel definition replays {kernel_type!r} on back end {settings.backend} "
                  f"(add config/kernels/<family>/{kernel_type}.yaml)")
        return items, {item.key: RowOutcome(STATUS_NO_DEFINITION, error=reason) for item in items}
    # Absolute paths: a persistent replay server may have been started from another working directory.
    reference = definition.reference if definition.schema_op else str(Path(definition.path).resolve())
    worker = WorkerSettings(rows_path=str(Path(rows_path).resolve()), kernel_type=kernel_type,
                            definition_path=reference,
                            backend=settings.backend, repeat_count=settings.repeat_count,
                            warmup_count=settings.warmup_count, memory_budget_bytes=settings.memory_budget_bytes,
                            seed=settings.seed, heater_min_power_w=settings.heater_min_power_w,
                            unprofiled_power_w=settings.unprofiled_power_w,
                            cpu_threads=settings.cpu_threads, time_budget_s=settings.time_budget_s,
                            min_repeat_count=settings.min_repeat_count)
    with device_slot(settings.backend, list(settings.device_ids), settings.slots_dir) as device_id:
        env = dict(os.environ)
        env.update(visible_devices_env(settings.backend, device_id))
        server = ({"backend": settings.backend, "device_id": device_id, "slots_dir": settings.slots_dir}
                  if settings.uses_server() and session is None else None)
        try:
            outcomes = run_isolated(worker, [item.index for item in items], timeout_s=settings.timeout_s,
                                    max_restarts=settings.max_restarts, env=env, cwd=os.getcwd(),
                                    wrap_command=session.wrap_command if session else None,
                                    stop_on_failure=settings.fail_fast, server=server)
        except OpperfError as exc:
            if exc.path != reference:
                raise
            # The definition as the user named it, not as the child was told (absolute, for a server started
            # in another directory).
            raise OpperfError(exc.reason, path=definition.path, row=exc.row, field=exc.field) from None
    by_key = outcomes_by_key(items, outcomes)
    if session is not None:
        from opperf.replay.npu.session import resolve_outcomes

        by_key = resolve_outcomes(by_key, session.summaries(), kernel_types=definition.kernel_types,
                                  kernel_type=kernel_type, repeat_count=settings.repeat_count)
    return items, by_key


def check_attempted(items: Sequence[WorkItem], outcomes: Mapping[tuple[str, ...], RowOutcome], rows_path) -> None:
    """A job in which no row could even be attempted (the replay process or server never started, the recipe
    could not be read) measured nothing: an error naming why, so the job fails and is re-run, not a CSV of
    `not_run` rows. Rows that were attempted and failed stay per-row outcomes."""
    if not items:
        return
    statuses = [outcomes[item.key].status if item.key in outcomes else STATUS_NOT_RUN for item in items]
    if all(status == STATUS_NOT_RUN for status in statuses):
        reasons = sorted({outcomes[item.key].error for item in items if item.key in outcomes} or {"no outcome"})
        raise OpperfError(f"no row of {len(items)} could be attempted: {reasons[0][:600]}", path=rows_path)


def find_definition(kernel_type: str, backend: str, definitions_dir: str | Path | None = None,
                    definition_path: str | Path | None = None) -> KernelDefinition | None:
    """The definition replaying `kernel_type` on `backend`: the given file (checked), or searched in a directory."""
    if definition_path:
        definition = load_definition(definition_path)
        if kernel_type not in definition.kernel_types:
            raise OpperfError(f"this definition replays {list(definition.kernel_types)}, not {kernel_type!r}",
                              path=definition_path, field="type")
        if not definition.supports(backend):
            raise OpperfError(f"this definition replays on {list(definition.backends)}, not {backend}",
                              path=definition_path, field="backends")
        return definition
    if definitions_dir is None:
        return None
    return definition_for(load_definitions(definitions_dir, backend), kernel_type, backend)


def recipe_for(kernel_type: str, backend: str, definition: KernelDefinition | None) -> KernelDefinition | None:
    """The definition if there is one; else, on a back end whose Types are op names, the op's schema (unless
    config/not_replayed.yaml says why the Type is not replayed); else None (rows become no_definition)."""
    if definition is not None or backend not in SCHEMA_BACKENDS:
        return definition
    from opperf.coverage import load_not_replayed

    if kernel_type in load_not_replayed().get(backend, {}):
        return None
    return schema_definition(kernel_type, (backend,))


def check_definition_fits(definition: KernelDefinition, frame, rows_path: str | Path, backend: str) -> None:
    """Refuse a definition that builds none of the rows (definitions.check_rows_fit); say how many rows it leaves to
    the op's schema (an `out=` variant, another overload), which their `Replay Recipe` then names."""
    counts = [contract.input_slot_count(row) for row in frame.to_dict(orient="records")]
    fitting = check_rows_fit(definition, counts, rows_path)
    if fitting < len(counts):
        log.warning("%s: %d of %d rows have a slot count %s does not take (it takes %s): %s", definition.type,
                    len(counts) - fitting, len(counts), definition.source, definition.slot_counts_text(),
                    "built from the op's schema, as their Replay Recipe says" if backend in SCHEMA_BACKENDS
                    else "they fail to build (Replay Error says why)")


def replay_kernel_csv(rows_path: str | Path, kernel_type: str, definitions_dir: str | Path | None,
                      output_path: str | Path, settings: ReplaySettings, *, version_dir: str | None,
                      trace_dir: str | Path | None = None, session=None, task_id: str | None = None,
                      definition_path: str | Path | None = None) -> KernelJobResult:
    """The replay job of one (database, kernel type): read, replay, write back, trace. See module docstring.

    The recipe is `definition_path` if given (the workflow passes the one file, so only its edits
    re-run this job), else the definition under `definitions_dir` that replays `kernel_type`; with
    neither, the op's schema (cpu/cuda, `recipe_for`), else every row is recorded `no_definition` and kept.
    A job in which no row could be attempted raises (`check_attempted`) and writes nothing.
    """
    settings.validate()
    contract.check_kernel_type(kernel_type, field="--kernel")
    if version_dir is not None:
        check_stack_matches(version_dir, settings.backend)
    frame = read_database_csv(rows_path, required=contract.SIGNATURE_COLUMNS)
    definition = recipe_for(kernel_type, settings.backend,
                            find_definition(kernel_type, settings.backend, definitions_dir, definition_path))
    if definition is not None:
        check_definition_fits(definition, frame, rows_path, settings.backend)
    trace = Trace(trace_dir, kernel_type, task_id) if trace_dir is not None else None
    check_writable(output_path, *([trace.directory / "probe"] if trace else []))   # before minutes of replay
    collected_at = utc_timestamp()
    with span("replay.kernel", log, kernel=kernel_type, rows=len(frame)) as result:
        items, outcomes = replay_rows(frame, kernel_type, definition, rows_path, settings, session=session)
        result.update(calls=len(items), ok=sum(o.status == STATUS_OK for o in outcomes.values()))
    check_attempted(items, outcomes, rows_path)
    if settings.fail_fast:
        failed = [(item, outcomes[item.key]) for item in items
                  if item.key in outcomes and outcomes[item.key].status in INVALID_STATUSES]
        if failed:
            item, outcome = failed[0]
            raise OpperfError(f"--fail-fast: {outcome.status}: {outcome.error}", path=rows_path, row=item.line,
                              field=contract.INPUT_SHAPES)
    written, report = write_back(frame, kernel_type, outcomes, collected_at=collected_at,
                                 prune_invalid_rows=settings.prune_invalid_rows,
                                 prune_empty_duration_rows=settings.prune_empty_duration_rows,
                                 update_mode=settings.update_mode)
    job = KernelJobResult(kernel_type, items, outcomes, report)
    log.info("%s: %s; statuses %s", kernel_type, report.summary(), json.dumps(job.status_counts()))
    if trace is not None:
        job.trace_files = write_traces(trace, job, frame, definition, settings, rows_path, output_path,
                                       definitions_dir)
    write_csv_atomic(output_path, written)       # last: the output exists only if everything before it was written
    return job


# --- traces -------------------------------------------------------------------------------------

def _row_text(row: Mapping[str, str]) -> str:
    return " | ".join(contract.strip_profiler_quotes(row.get(c, "")) for c in contract.SIGNATURE_COLUMNS)


def _budget_text(settings: ReplaySettings) -> str:
    """How the job's rows got their timed calls, where a time budget chose them (the spec trace)."""
    budget = settings.repeat_budget()
    return "" if budget is None else (f" at most, {budget.min_count} at least, chosen per row by a time budget of "
                                      f"{budget.time_budget_s:g} s")


def write_traces(trace: Trace, job: KernelJobResult, frame, definition: KernelDefinition | None,
                 settings: ReplaySettings, rows_path, output_path, definitions_dir) -> list[Path]:
    """REPLAY/VERIFY/BACKFILL trace files and the standalone reproducer of this job."""
    rows = frame.to_dict(orient="records")
    files = []
    spec = [f"kernel type: {job.kernel_type}",
            f"definition: {definition.reference if definition else '(none)'}",
            f"api: {definition.api if definition else ''}  hook: {definition.hook if definition else ''}",
            f"rows: {rows_path} ({len(rows)} rows, {len(job.items)} distinct calls)",
            f"back end: {settings.backend}; repeat count {settings.repeat_count}{_budget_text(settings)}; "
            f"warm-up {settings.warmup_count}; "
            f"update mode {settings.update_mode}; timeout {settings.timeout_s:g} s per row; L2 policy "
            f"{CACHE_POLICY}",
            f"output: {output_path}"]
    files.append(trace.record(TRACE_STEP, "REPLAY", "spec", "\n".join(spec)))
    result_lines = ["line\tstatus\tAverage Duration(us)\tsamples\tcall"]
    error_lines, verify_lines, verify_errors = [], ["line\texpected outputs\tproduced outputs\tverdict"], []
    for item in job.items:
        outcome = job.outcomes.get(item.key)
        if outcome is None:
            continue
        result_lines.append(f"{item.line}\t{outcome.status}\t{outcome.columns.get(contract.REPLAY_AVERAGE, '')}\t"
                            f"{outcome.columns.get(contract.REPLAY_SAMPLE_COUNT, '')}\t{outcome.call}")
        if outcome.status in FAILED_STATUSES or outcome.error:
            error_lines.append(f"line {item.line}: {outcome.status}: {outcome.error}\n  row: {_row_text(rows[item.index])}")
        if outcome.expected_outputs or outcome.produced_outputs:
            verdict = "mismatch" if outcome.status == STATUS_FAILED_VERIFY else "match"
            verify_lines.append(f"{item.line}\t{outcome.expected_outputs}\t{outcome.produced_outputs}\t{verdict}")
        if outcome.status == STATUS_FAILED_VERIFY:
            verify_errors.append(f"line {item.line}: {outcome.error}\n  profiled signature: {_row_text(rows[item.index])}"
                                 f"\n  replayed call: {outcome.call}\n  replay produced: {outcome.produced_outputs}")
    files.append(trace.record(TRACE_STEP, "REPLAY", "result", "\n".join(result_lines)))
    if error_lines:
        files.append(trace.record(TRACE_STEP, "REPLAY", "error_log", "\n".join(error_lines)))
    files.append(trace.record(TRACE_STEP, "VERIFY", "result", "\n".join(verify_lines)))
    if verify_errors:
        files.append(trace.record(TRACE_STEP, "VERIFY", "error_log", "\n".join(verify_errors)))
    backfill = [job.writeback.summary()] + [f"pruned line {line}: {reason} [{signature}]"
                                            for line, reason, signature in job.writeback.pruned]
    files.append(trace.record(TRACE_STEP, "BACKFILL", "result", "\n".join(backfill)))
    files.append(render_reproducer(trace.verify_dir(TRACE_STEP) / f"replay_{job.kernel_type}.py", job, rows,
                                   definition, settings, definitions_dir))
    return files


def render_reproducer(path: Path, job: KernelJobResult, rows: Sequence[Mapping[str, str]],
                      definition: KernelDefinition | None, settings: ReplaySettings, definitions_dir) -> Path:
    """The standalone script that re-runs this job's rows by hand (templates/replay_reproducer.py.j2)."""
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    columns = (*contract.SIGNATURE_COLUMNS, contract.OUTPUT_FORMATS, contract.INPUT_SCALARS, contract.EP_SIZE)
    cases = []
    for item in job.items:
        row = rows[item.index]
        outcome = job.outcomes.get(item.key)
        cases.append({"line": item.line, "status": outcome.status if outcome else "",
                      "average_us": outcome.columns.get(contract.REPLAY_AVERAGE, "") if outcome else "",
                      "row": {c: str(row[c]) for c in columns if c in row}})
    text = environment.get_template(REPRODUCER_TEMPLATE).render(
        kernel_type=job.kernel_type, backend=settings.backend, repeat_count=settings.repeat_count,
        warmup_count=settings.warmup_count, time_budget_s=repr(settings.time_budget_s),
        min_repeat_count=settings.min_repeat_count, cpu_threads=repr(settings.cpu_threads), memory_budget_bytes=repr(settings.memory_budget_bytes),
        seed=settings.seed,
        definition_path=(definition.reference if definition.schema_op else str(Path(definition.path).resolve()))
        if definition else "",
        repo_root=str(Path(__file__).resolve().parents[2]), python=sys.executable,
        cases_json=json.dumps(cases, indent=1),
        generated_at=utc_timestamp())
    write_text_atomic(path, text, executable=True)
    return path
