"""The gates a database must pass before a performance model can use it, per kernel type.

- *findable*: every row with a duration is what the runtime answers when asked for that row's own call
  (`opperf.consumer.runtime.find` over the op_mapping.yaml the database ships);
- *unique*: no two rows share a runtime key (the runtime would only ever return the first);
- *dense*: every axis of the density standard (`config/density_standard.yaml`) has its points;
- *interpolable*: each interior replayed row, left out, is predicted from its neighbours by the runtime's
  interpolation rule within the error the holdout reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opperf.consumer.runtime import (answered_by_output, duplicate_keys, find, row_latency, row_query,
                                     unspelled_input_dtypes)
from opperf.io import read_database_csv


@dataclass
class KernelCheck:
    """What the checks found for one kernel type."""

    kernel_type: str
    rows: int = 0
    layout_rows: int | None = None
    rows_with_duration: int = 0
    findable: int = 0
    scaled: int = 0                       # elementwise rows whose calls the first row of their output shape answers
    not_modelled: int = 0                 # rows whose only mapped ops use query modes the model does not cover
    unmapped: int = 0                     # rows of a kernel type no framework op the runtime receives maps to
    dtype_unmapped: list[dict[str, Any]] = field(default_factory=list)   # rows of a dtype the runtime cannot spell
    mapped_ops: list[str] = field(default_factory=list)
    duplicate_key_lines: list[list[int]] = field(default_factory=list)
    misses: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows, "layout_rows": self.layout_rows, "rows_with_duration": self.rows_with_duration,
            "findable": self.findable, "answered_scaled": self.scaled, "not_modelled": self.not_modelled,
            "unmapped": self.unmapped, "dtype_unmapped": self.dtype_unmapped,
            "mapped_ops": self.mapped_ops,
            "duplicate_runtime_keys": len(self.duplicate_key_lines), "duplicate_key_lines": self.duplicate_key_lines,
            "misses": self.misses,
        }


MODELLED_QUERY_MODES = (None, "elementwise")


def check_findable(operator_mappings: dict, tables: dict) -> dict[str, KernelCheck]:
    """Per kernel type: rows, rows with a duration, rows the runtime answers with themselves, duplicate keys."""
    checks = {}
    for kernel_type, table in tables.items():
        check = KernelCheck(kernel_type, rows=len(table))
        ops = {op: m for op, m in operator_mappings.items()
               if kernel_type in (m.get("kernel_type"), *(m.get("alternate_kernel_types") or []))}
        check.mapped_ops = sorted(ops)
        elementwise = any(m.get("query_mode") == "elementwise" for m in ops.values())
        check.duplicate_key_lines = duplicate_keys(table, elementwise=elementwise)
        modelled = {op: m for op, m in ops.items()
                    if m.get("query_mode") in MODELLED_QUERY_MODES and not m.get("composite")}
        for index, record in enumerate(table.to_dict(orient="records")):
            if row_latency(record) is None:
                continue
            check.rows_with_duration += 1
            if not ops:
                check.unmapped += 1
                continue
            if not modelled:
                check.not_modelled += 1
                continue
            query, why = row_query(record)
            unspelled = unspelled_input_dtypes(record) if query is None else []
            if unspelled:
                # The runtime never asks for it (a complex rotary's mul): listed, not failed; its calls are
                # priced at the runtime's roofline (the consumer gate's DTYPE_UNMAPPED).
                check.dtype_unmapped.append({"line": index + 2, "dtypes": unspelled})
                continue
            if query is not None:
                answers = {op: find(tables, m, query) for op, m in modelled.items()}
                if any(answer == (kernel_type, index) for answer in answers.values()):
                    check.findable += 1
                    continue
                if any(answered_by_output(modelled[op], table, kernel_type, index, answer)
                       for op, answer in answers.items()):
                    check.scaled += 1
                    continue
                why = "; ".join(f"{op} is answered by "
                                + (f"{answer[0]}.csv line {answer[1] + 2}" if answer else "no row")
                                for op, answer in answers.items())
            check.misses.append({"line": index + 2, "why": why})
        checks[kernel_type] = check
    return checks


def add_layout_rows(database: str | Path, checks: dict[str, KernelCheck]) -> None:
    for kernel_type, check in checks.items():
        path = Path(database) / "layouts" / f"{kernel_type}.csv"
        if path.is_file():
            check.layout_rows = len(read_database_csv(path))

