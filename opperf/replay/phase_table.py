"""Stage 4b's table and how it is folded into a database's rows, with no trace or profiler behind it.

The phase stage (scripts/phase_replay.py, opperf.replay.phase) writes one line per row it replayed in the
workload's own call order (the whole trace); the database stage (opperf.database.build) and the replay report
(opperf.report.build) fold it into the rows they read. Those run where the parse's polars may not be installed
(the npu env writes replay reports), so this module needs pandas only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from opperf import contract
from opperf.io import read_database_csv
from opperf.stats import format_number, number_or_none

TYPE = "Type"       # the kernel type, as the parse's call tables (and profiler tables) name it
# What the parse groups a row's calls by, besides the kernel type (opperf.parse.aggregate).
KEY_COLUMNS = (contract.INPUT_SHAPES, contract.OUTPUT_SHAPES, contract.INPUT_DTYPES, contract.OUTPUT_DTYPES,
               *contract.CALL_KEY_COLUMNS)

# The phase stage's table: one line per row replayed in a phase (keyed as the parse keys rows).
PHASE_CALLS = "Phase Calls"
PHASE_PROFILED = "Phase Profiled Average Duration(us)"
PHASE_REPLAYED = "Phase Replay Average Duration(us)"
PHASE_METHOD = "Phase Timing Method"
PHASE_APPLIED = "Applied"
PHASE_TABLE_COLUMNS = (TYPE, *KEY_COLUMNS, PHASE_CALLS, PHASE_PROFILED, PHASE_REPLAYED, PHASE_METHOD, PHASE_APPLIED)


def row_key(kernel_type: str, row: Mapping[str, object]) -> tuple[str, ...]:
    """The kernel type and the signature columns of a call or a row, as the parse compares them."""
    return (kernel_type, *(str(row.get(column) or "").strip() for column in KEY_COLUMNS))


def applied_time_ratio(table: pd.DataFrame) -> tuple[int, float | None]:
    """How many of the table's rows apply, and their calls' in-phase time over their profiled time."""
    applied = [line for line in table.to_dict("records") if line[PHASE_APPLIED] == "yes"]
    replayed = sum(float(line[PHASE_REPLAYED]) * int(line[PHASE_CALLS]) for line in applied)
    profiled = sum(float(line[PHASE_PROFILED]) * int(line[PHASE_CALLS]) for line in applied)
    return len(applied), (replayed / profiled if profiled else None)


_PHASE_NOTE = " replayed in the workload's phase(s):"
_PHASE_NOTE_START = re.compile(r"(?:^|; )\d+ of \d+ calls" + re.escape(_PHASE_NOTE))


def read_phase_table(path: str | Path) -> pd.DataFrame:
    """A phase stage's table, checked for its columns (an OpperfError names the file and what is missing)."""
    return read_database_csv(path, required=PHASE_TABLE_COLUMNS)


def apply_phase_table(frame: pd.DataFrame, kernel_type: str, table: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows with their phase replay folded in, and how many changed. A row with an applied line of `table`
    keeps its one-at-a-time mean in `Replay Isolated Average Duration(us)` and gets the in-phase mean and call
    count; its `Average Duration(us)` becomes the blend over its profiled calls (k of n in the phase):
    (k * in-phase + (n - k) * isolated) / n, the in-phase mean alone when every call was in the phase. Every other
    row is left exactly as it was."""
    lines = {row_key(kernel_type, line): line for line in table.to_dict("records")
             if str(line.get(TYPE)) == kernel_type and str(line.get(PHASE_APPLIED)) == "yes"}
    if not lines:
        return frame, 0
    records = frame.to_dict("records")
    changed = 0
    for record in records:
        line = lines.get(row_key(kernel_type, {k: "" if v is None else str(v) for k, v in record.items()}))
        if line is None or record.get(contract.SOURCE) == contract.SOURCE_GENERATED:
            continue
        phase_mean, calls = float(line[PHASE_REPLAYED]), int(float(line[PHASE_CALLS]))
        # Applied before (a database folded in place twice): the one-at-a-time mean is the kept one.
        isolated = (number_or_none(record.get(contract.REPLAY_ISOLATED_AVERAGE))
                    or number_or_none(record.get(contract.REPLAY_AVERAGE)))
        total = max(int(number_or_none(record.get(contract.PROFILING_SAMPLE_COUNT)) or calls), calls)
        if isolated is None and calls < total:
            continue
        blended = phase_mean if isolated is None else (phase_mean * calls + isolated * (total - calls)) / total
        record[contract.REPLAY_ISOLATED_AVERAGE] = format_number(isolated)
        record[contract.REPLAY_PHASE_AVERAGE] = format_number(phase_mean)
        record[contract.REPLAY_PHASE_CALLS] = str(calls)
        record[contract.REPLAY_AVERAGE] = format_number(blended)
        method = _PHASE_NOTE_START.split(str(record.get(contract.REPLAY_TIMING_METHOD) or ""))[0]
        record[contract.REPLAY_TIMING_METHOD] = "; ".join(filter(None, (
            method, f"{calls} of {total} calls{_PHASE_NOTE} {line[PHASE_METHOD]}")))
        changed += 1
    columns = contract.order_columns([*frame.columns, contract.REPLAY_AVERAGE, contract.REPLAY_TIMING_METHOD,
                                      contract.REPLAY_ISOLATED_AVERAGE, contract.REPLAY_PHASE_AVERAGE,
                                      contract.REPLAY_PHASE_CALLS])
    return pd.DataFrame(records, columns=columns).fillna(""), changed
