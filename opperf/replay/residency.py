"""Which inputs the device cache still holds when the workload's call starts, from the row's reuse distances.

The parse writes, per input slot, how many MiB of other data the device touched since the slot's tensor was last
used (`Profiling Input Reuse Distance(MiB)`, opperf.parse.reuse). An LRU cache of C bytes still holds the last
C - D bytes of a tensor after D bytes of other traffic: the insitu cache state rewrites exactly that tail of each
input (and nothing of an input whose distance is C or more), instead of the definition's warm/cold guess.
Measured on an H100 (benchmarks/results/small_kernels/, `cold` variant): decode rows whose inputs were written
before a weight stream (the residual of an add, the gate of silu*up, the KV cache read by decode attention)
replay 20-30 % fast with those inputs warm and within a few % with them cold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from opperf import contract
from opperf.errors import OpperfError

MIB = 2**20


def parse_reuse(text: str | None, *, path=None, line=None) -> list[float | None]:
    """The row's per-slot distances in MiB (`inf` = not used before; None = not measured)."""
    out: list[float | None] = []
    for part in text.split(";") if text else []:
        part = part.strip()
        try:
            value = float(part) if part else None
        except ValueError as exc:
            raise OpperfError(f"reuse distance {part!r} is not a number of MiB or inf", path=path, row=line,
                              field=contract.PROFILING_INPUT_REUSE) from exc
        if value is not None and (math.isnan(value) or value < 0):
            raise OpperfError(f"reuse distance {part!r} is negative or NaN", path=path, row=line,
                              field=contract.PROFILING_INPUT_REUSE)
        out.append(value)
    return out


def slot_reuse(case_tensors: list[torch.Tensor], slots, distances: list[float | None]
               ) -> dict[int, float]:
    """id(tensor) → reuse distance (MiB), each slot with a distance matched to one built tensor of its shape and
    dtype (two slots of one shape and dtype, as in add(a, b), are interchangeable for the kernel)."""
    from opperf.replay.inputs import TORCH_DTYPES

    free = list(case_tensors)
    found: dict[int, float] = {}
    for index, distance in enumerate(distances):
        shape = slots.input_shapes[index] if index < len(slots.input_shapes) else None
        dtype_name = slots.input_dtypes[index] if index < len(slots.input_dtypes) else ""
        if distance is None or shape is None:
            continue
        dtype = TORCH_DTYPES.get(contract.canonical_dtype(dtype_name)) if contract.is_known_dtype(dtype_name) else None
        for position, tensor in enumerate(free):
            if tuple(tensor.shape) == tuple(shape) and (dtype is None or tensor.dtype == dtype):
                found[id(free.pop(position))] = distance
                break
    return found


def resident_bytes(nbytes: int, distance_mib: float, capacity: int) -> int:
    """What an LRU cache of `capacity` bytes still holds of an `nbytes` tensor after `distance_mib` MiB of other
    data: its last capacity - distance bytes, at most all of it."""
    if math.isinf(distance_mib):
        return 0
    return int(min(nbytes, max(0.0, capacity - distance_mib * MIB)))


def row_reuse(row: Mapping[str, str], *, path=None, line=None) -> list[float | None]:
    return parse_reuse(row.get(contract.PROFILING_INPUT_REUSE), path=path, line=line)
