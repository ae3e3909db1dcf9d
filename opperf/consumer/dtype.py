"""The database's dtype: the activation dtype of its GEMM rows, recorded by the build in op_mapping.yaml
(`opperf.dtype`, `opperf.dtype_rows`) and read by scripts/predict.py (opperf.consumer.predict.database_dtypes),
which records a model's queries in it.

Why the GEMM rows: a model's matmuls run in the dtype the model was built in, while its norms, rotary tables and
softmaxes upcast to float32 and its indices are int64, so every database of a bfloat16 model holds float32 rows
too. A GEMM row's first floating-point input is its activation. A bfloat16 model whose router runs in float32
(DeepSeek-V3, GLM-4-MoE) has GEMM rows of both: the database then records both and no single dtype. A database
without GEMM rows is counted over every row's first floating-point input.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from opperf import contract

# The runtime's dtype spellings (and the profilers') by the torch name a model is built in.
_ACTIVATION_DTYPES = {"DT_BF16": "bfloat16", "DT_FLOAT16": "float16", "DT_FLOAT": "float32", "DT_DOUBLE": "float64"}
# Kernel types named after a torch GEMM op (a cpu/cuda database's types without a definition, `_grouped_mm`).
_GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "matmul", "linear"})
GEMM_ROWS, ALL_ROWS = "GEMM rows", "all rows"


@dataclass(frozen=True)
class DatabaseDtype:
    """Rows per activation dtype (torch names, most first), what was counted, and where it was read."""

    rows: dict[str, int]
    counted: str              # GEMM_ROWS | ALL_ROWS
    source: str               # "op_mapping.yaml" or how it was inferred

    @property
    def dtype(self) -> str | None:
        """The database's dtype where its counted rows hold one, else None (several, or none at all)."""
        return next(iter(self.rows)) if len(self.rows) == 1 else None

    def describe(self) -> str:
        """`812 bfloat16 and 40 float32 GEMM rows`."""
        what = "GEMM rows" if self.counted == GEMM_ROWS else "rows (no GEMM rows)"
        if not self.rows:
            return f"no floating-point input in its {what}"
        counts = [f"{count:,} {name}" for name, count in self.rows.items()]
        listed = counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} and {counts[-1]}"
        return f"{listed} {what}"


def _is_gemm(kernel_type: str, category: str | None) -> bool:
    from opperf.consumer.runtime import RUNTIME_MATMUL_KERNELS

    return category == "matmul" or kernel_type in _GEMM_OPS or kernel_type in RUNTIME_MATMUL_KERNELS


def _activation_dtype(dtypes_cell: object) -> str | None:
    """A row's first floating-point input dtype (torch name), or None."""
    for name in contract.parse_names(dtypes_cell):
        if contract.is_known_dtype(name) and contract.canonical_dtype(name) in _ACTIVATION_DTYPES:
            return _ACTIVATION_DTYPES[contract.canonical_dtype(name)]
    return None


def count_activation_dtypes(tables: Mapping, categories: Mapping[str, str | None],
                            source: str = "op_mapping.yaml") -> DatabaseDtype:
    """Rows per activation dtype of the GEMM kernel types among `tables` (kernel type -> every row, as strings),
    or of every kernel type where none is a GEMM. `categories`: kernel type -> its definition's category."""
    gemm = {k: t for k, t in tables.items() if _is_gemm(k, categories.get(k))}
    counted, chosen = (GEMM_ROWS, gemm) if gemm else (ALL_ROWS, tables)
    counts: Counter[str] = Counter()
    for table in chosen.values():
        if contract.INPUT_DTYPES not in table.columns:
            continue
        counts.update(d for d in map(_activation_dtype, table[contract.INPUT_DTYPES]) if d)
    return DatabaseDtype(dict(counts.most_common()), counted, source)


def op_mapping_fields(dtypes: DatabaseDtype) -> dict:
    """The keys op_mapping.yaml's `opperf:` block records."""
    return {"dtype": dtypes.dtype, "dtype_rows": dict(dtypes.rows), "dtype_counted": dtypes.counted}
