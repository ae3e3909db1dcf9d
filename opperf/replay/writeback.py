"""Write replay outcomes back into a kernel type's rows, by signature, without ever losing a row.

Every input row is in the output, in its order, unless the user asked for pruning
(`--prune-invalid-rows`, `--prune-empty-duration-rows`); every pruned row is listed in the
BACKFILL trace. A row whose call was replayed gets the outcome's status and error, and numbers only
when the call verified; a row not replayed (missing-only, no outcome) is left exactly as it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from opperf import contract
from opperf.replay.engine import (FAILED_STATUSES, STATUS_NO_DEFINITION, STATUS_UNSUPPORTED_BACKEND, RowOutcome,
                                  has_valid_duration, replay_key)

# Columns a replay owns: cleared before an outcome is written, so no stale number survives a failure.
REPLAY_RESULT_COLUMNS = (contract.REPLAY_AVERAGE, contract.REPLAY_MEDIAN, contract.REPLAY_P10, contract.REPLAY_P90,
                         contract.REPLAY_CV, contract.REPLAY_SAMPLE_COUNT, contract.REPLAY_TIMING_METHOD,
                         contract.REPLAY_L2_POLICY, contract.REPLAY_RECIPE, contract.REPLAY_STATUS, contract.REPLAY_ERROR,
                         contract.REPLAY_SM_CLOCK, contract.REPLAY_POWER)
# A phase replay's columns (opperf.replay.phase) describe the row's previous replay: cleared with it.
PHASE_COLUMNS = (contract.REPLAY_ISOLATED_AVERAGE, contract.REPLAY_PHASE_AVERAGE, contract.REPLAY_PHASE_CALLS)
INVALID_STATUSES = FAILED_STATUSES | {STATUS_NO_DEFINITION, STATUS_UNSUPPORTED_BACKEND}


@dataclass
class WritebackReport:
    """What the write-back did, row by row where rows left (for the BACKFILL trace and the report)."""

    rows_in: int = 0
    rows_out: int = 0
    updated: int = 0               # rows that received an outcome
    measured: int = 0              # ... of which now hold a replay duration
    untouched: int = 0             # rows without an outcome (missing-only, filtered)
    appended: int = 0
    pruned: list[tuple[int, str, str]] = field(default_factory=list)   # (file line, reason, signature)

    def summary(self) -> str:
        return (f"rows in {self.rows_in}, out {self.rows_out}; updated {self.updated} (measured {self.measured}), "
                f"untouched {self.untouched}, appended {self.appended}, pruned {len(self.pruned)}")


def apply_outcome(row: dict[str, str], outcome: RowOutcome, collected_at: str) -> None:
    for column in REPLAY_RESULT_COLUMNS:
        row[column] = ""
    for column in [c for c in row if c.startswith(contract.MICROBENCH_COUNTER_PREFIX) or c in PHASE_COLUMNS]:
        row[column] = ""
    row.update(outcome.columns)
    row[contract.REPLAY_RECIPE] = outcome.recipe
    row[contract.REPLAY_STATUS] = outcome.status
    row[contract.REPLAY_ERROR] = outcome.error.replace("\n", " ")
    row[contract.COLLECTED_AT] = collected_at


def write_back(frame: pd.DataFrame, kernel_type: str, outcomes: Mapping[tuple[str, ...], RowOutcome], *,
               collected_at: str, prune_invalid_rows: bool = False, prune_empty_duration_rows: bool = False,
               appended_rows: Iterable[Mapping[str, str]] = (),
               update_mode: str = "all") -> tuple[pd.DataFrame, WritebackReport]:
    """The rows with outcomes applied (matched by `engine.replay_key`), plus appended rows, minus pruned ones.

    `missing-only`: a row that already holds a valid `Average Duration(us)` is left as it is, even when
    another row of its signature was replayed.
    """
    report = WritebackReport(rows_in=len(frame))
    columns = list(frame.columns) + [c for c in REPLAY_RESULT_COLUMNS + (contract.COLLECTED_AT,)
                                     if c not in frame.columns]
    kept: list[dict[str, str]] = []
    rows = frame.to_dict(orient="records")
    for index, row in enumerate(rows):
        row = {c: row.get(c, "") for c in columns}
        line = index + 2
        key = replay_key(row, kernel_type)
        filled = update_mode == "missing-only" and has_valid_duration(row.get(contract.REPLAY_AVERAGE, ""))
        if key in outcomes and not filled:
            apply_outcome(row, outcomes[key], collected_at)
            # Outcome columns the input lacked (MicroBench <counter> of an NPU session) join the header.
            columns.extend(c for c in outcomes[key].columns if c not in columns)
            report.updated += 1
            report.measured += has_valid_duration(row[contract.REPLAY_AVERAGE])
        else:
            report.untouched += 1
        signature = " | ".join(key[:-1])
        if prune_invalid_rows and row.get(contract.REPLAY_STATUS, "") in INVALID_STATUSES:
            report.pruned.append((line, f"--prune-invalid-rows: {row[contract.REPLAY_STATUS]}: "
                                        f"{row.get(contract.REPLAY_ERROR, '')}", signature))
            continue
        if prune_empty_duration_rows and not has_valid_duration(row.get(contract.REPLAY_AVERAGE, "")) \
                and not has_valid_duration(row.get(contract.PROFILING_AVERAGE, "")):
            report.pruned.append((line, "--prune-empty-duration-rows: neither a replay nor a profiling duration",
                                  signature))
            continue
        kept.append(row)
    for extra in appended_rows:
        row = {c: "" for c in columns}
        row.update(extra)
        for column in extra:
            if column not in columns:
                columns.append(column)
        kept.append(row)
        report.appended += 1
    ordered = contract.order_columns(columns)
    result = pd.DataFrame(kept, columns=ordered).fillna("") if kept else pd.DataFrame(columns=ordered)
    report.rows_out = len(result)
    assert report.rows_out == report.rows_in + report.appended - len(report.pruned), report.summary()
    return result, report


def outcomes_by_key(items: Sequence, outcomes: Mapping[int, RowOutcome]) -> dict[tuple[str, ...], RowOutcome]:
    """Work items' outcomes (by row index) keyed by the replay key every row of the group shares."""
    return {item.key: outcomes[item.index] for item in items if item.index in outcomes}
