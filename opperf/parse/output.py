"""Writing a parsed database directory: complete or not at all, and the PARSE traces beside it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from opperf.contract import KERNEL_TYPES_MANIFEST, TRACE_ATTRIBUTION, PROFILE_OVERHEAD, INPUT_SHAPES, OUTPUT_SHAPES, PROFILING_AVERAGE, PROFILING_SAMPLE_COUNT, kernel_type_problem
from opperf.io import staged_directory
from opperf.parse.aggregate import ParsedDatabase
from opperf.trace import Trace

MANIFEST = KERNEL_TYPES_MANIFEST
PARSE_STEP = 1


def _write_table(path: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n", extrasaction="raise")
        writer.writeheader()
        writer.writerows({c: row.get(c, "") for c in columns} for row in rows)


def write_parsed_directory(directory: str | Path, database: ParsedDatabase,
                           attribution: dict[str, dict] | None = None,
                           overhead: dict[str, dict] | None = None) -> list[Path]:
    """`{Type}.csv` per kernel type + `kernel_types.txt`, built in a temporary sibling and moved into place.

    A new directory appears by one rename. An existing one has each file replaced atomically (the manifest
    last), and the CSVs of kernel types its old manifest listed but this parse no longer has are removed.
    """
    directory = Path(directory)
    for kernel_type in database.kernel_types:      # belt and braces: hostile names never reach a path
        problem = kernel_type_problem(kernel_type)
        if problem:
            raise ValueError(problem)
    with staged_directory(directory) as staging:
        for kernel_type in database.kernel_types:
            _write_table(staging / f"{kernel_type}.csv", database.columns[kernel_type], database.rows[kernel_type])
        if attribution:
            (staging / TRACE_ATTRIBUTION).write_text(json.dumps(attribution, indent=1) + "\n", encoding="utf-8")
        if overhead:
            (staging / PROFILE_OVERHEAD).write_text(json.dumps(overhead, indent=1) + "\n", encoding="utf-8")
        (staging / MANIFEST).write_text("".join(f"{t}\n" for t in database.kernel_types), encoding="utf-8")
    if not attribution:
        (directory / TRACE_ATTRIBUTION).unlink(missing_ok=True)     # an earlier parse's account is not this one's
    if not overhead:
        (directory / PROFILE_OVERHEAD).unlink(missing_ok=True)
    return [directory / f"{t}.csv" for t in database.kernel_types] + [directory / MANIFEST]


def write_parse_traces(trace_dir: str | Path, database: ParsedDatabase, task_id: str | None = None) -> None:
    """Per kernel type: what was read (spec), what was written (result), what was skipped (error_log, only where
    a row was)."""
    for kernel_type in database.kernel_types:
        trace = Trace(trace_dir, kernel_type, task_id)
        sources = database.source_rows.get(kernel_type, {})
        spec = [f"PARSE {kernel_type}: rows read per source file"]
        spec += [f"{path}\t{count} rows" for path, count in sources.items()]
        trace.record(PARSE_STEP, "PARSE", "spec", "\n".join(spec))
        rows = database.rows[kernel_type]
        samples = sum(int(r.get(PROFILING_SAMPLE_COUNT) or 0) for r in rows)
        columns = [INPUT_SHAPES, OUTPUT_SHAPES, PROFILING_SAMPLE_COUNT, PROFILING_AVERAGE]
        result = [f"PARSE {kernel_type}: {len(rows)} groups from {samples} rows", "\t".join(columns)]
        result += ["\t".join(r.get(c, "") for c in columns) for r in rows]
        trace.record(PARSE_STEP, "PARSE", "result", "\n".join(result))
        skipped = database.skipped_by_type.get(kernel_type, [])
        if skipped:        # as the replay's traces: an error_log only where something went wrong
            error_log = [f"PARSE {kernel_type}: {len(skipped)} rows skipped"] + [s.describe() for s in skipped]
            trace.record(PARSE_STEP, "PARSE", "error_log", "\n".join(error_log))
