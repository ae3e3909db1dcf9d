"""The memory estimator: does one row's kernel fit in device memory (HBM)?

A row needs the bytes of every input and output tensor (element count of its logical shape, FRACTAL_NZ
storage shapes read through `contract.logical_shape`, times the size of its profiler dtype) plus a
workspace margin (a fraction of the tensor bytes plus a fixed amount, both in grid.yaml `memory:`).
Rows over the budget are dropped by the grid stage and counted.

A budget in GB is taken as GiB (2**30 bytes), the unit vendors size HBM in (a "64 GB" die holds 64 GiB).
A tensor slot whose dtype name is unknown is counted at 8 bytes per element, the widest common size,
so the estimate errs towards dropping a row rather than keeping one that cannot run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from opperf.contract import dtype_bytes, is_known_dtype, logical_shape

BYTES_PER_GB = 1 << 30
BYTES_PER_MIB = 1 << 20
UNKNOWN_DTYPE_BYTES = 8

Shape = tuple[int, ...]


def tensor_bytes(shape: Shape | None, dtype: str, fmt: str) -> int:
    """Bytes of one tensor slot (0 for an empty slot)."""
    logical = logical_shape(shape, fmt or "ND")
    if logical is None:
        return 0
    per_element = dtype_bytes(dtype) if dtype and is_known_dtype(dtype) else UNKNOWN_DTYPE_BYTES
    return math.ceil(math.prod(logical) * per_element)


def _slots_bytes(shapes: Sequence[Shape | None], dtypes: Sequence[str], formats: Sequence[str]) -> int:
    def at(names: Sequence[str], index: int) -> str:
        return names[index] if index < len(names) else ""
    return sum(tensor_bytes(shape, at(dtypes, i), at(formats, i)) for i, shape in enumerate(shapes))


@dataclass(frozen=True)
class MemoryEstimator:
    """Bytes a row needs on the device, and whether that fits a budget."""

    budget_bytes: int
    workspace_fraction: float = 0.1
    workspace_bytes: int = 64 * BYTES_PER_MIB

    @classmethod
    def for_budget_gb(cls, max_hbm_gb: float, workspace_fraction: float = 0.1, workspace_mib: float = 64.0):
        return cls(budget_bytes=int(max_hbm_gb * BYTES_PER_GB), workspace_fraction=workspace_fraction,
                   workspace_bytes=int(workspace_mib * BYTES_PER_MIB))

    def row_bytes(self, input_shapes, input_dtypes, input_formats, output_shapes, output_dtypes,
                  output_formats) -> int:
        tensors = (_slots_bytes(input_shapes, input_dtypes, input_formats)
                   + _slots_bytes(output_shapes, output_dtypes, output_formats))
        return math.ceil(tensors * (1 + self.workspace_fraction)) + self.workspace_bytes

    def fits(self, *slots) -> bool:
        return self.row_bytes(*slots) <= self.budget_bytes
