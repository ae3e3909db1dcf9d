"""Check that a replayed call produced what the row says the profiled call produced.

Slot by slot against `Output Shapes` / `Output Data Types`: empty slots are skipped, FRACTAL_NZ
storage shapes compare as their ND matrix. A mismatch means the replay ran a different
configuration than was profiled, so its time must not be written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opperf import contract
from opperf.replay.definitions import OutputSpec
from opperf.replay.inputs import PROFILER_DTYPES, RowSlots


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    expected: str          # the row's outputs as `shapes | dtypes`
    produced: str          # what the call returned, in the same spelling
    message: str = ""


def produced_outputs(result: Any) -> list[torch.Tensor | None]:
    """A call's return value as a list of output slots (a tensor → one slot; tuples/lists → one per item)."""
    if isinstance(result, torch.Tensor):
        return [result]
    if result is None:
        return []
    if isinstance(result, (tuple, list)):
        slots: list[torch.Tensor | None] = []
        for item in result:
            if isinstance(item, torch.Tensor) or item is None:
                slots.append(item)
            elif isinstance(item, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in item):
                slots.extend(item)
            else:
                slots.append(None)     # non-tensor outputs (ints, symbolic sizes) have no shape slot
        return slots
    return []


def _dtype_name(tensor: torch.Tensor) -> str:
    return PROFILER_DTYPES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))


def describe_outputs(outputs: Sequence[torch.Tensor | None]) -> str:
    shapes = contract.format_shapes(tuple(t.shape) if t is not None else None for t in outputs)
    dtypes = ";".join(_dtype_name(t) if t is not None else "" for t in outputs)
    return f"{shapes} | {dtypes}"


def describe_expected(row: Mapping[str, str]) -> str:
    return (f"{contract.strip_profiler_quotes(row.get(contract.OUTPUT_SHAPES, ''))} | "
            f"{contract.strip_profiler_quotes(row.get(contract.OUTPUT_DTYPES, ''))}")


def verify_outputs(row: Mapping[str, str], slots: RowSlots, result: Any, spec: OutputSpec) -> VerifyResult:
    """Compare the produced outputs with the row's output slots (see module docstring)."""
    outputs = produced_outputs(result)
    expected, produced = describe_expected(row), describe_outputs(outputs)
    if not spec.verify:
        return VerifyResult(True, expected, produced, "verification disabled by the kernel definition")
    problems = []
    for index, shape in enumerate(slots.output_shapes[:spec.slots]):
        if shape is None:
            continue
        fmt = slots.output_formats[index] if index < len(slots.output_formats) else ""
        want_shape = contract.logical_shape(shape, fmt)
        if index >= len(outputs) or outputs[index] is None:
            problems.append(f"output slot {index}: expected shape {list(want_shape)}, the call produced nothing")
            continue
        got = outputs[index]
        if tuple(got.shape) != tuple(want_shape):
            problems.append(f"output slot {index}: shape {list(got.shape)} != expected {list(want_shape)}")
        want_dtype = slots.output_dtypes[index] if index < len(slots.output_dtypes) else ""
        if want_dtype and contract.is_known_dtype(want_dtype):
            if contract.canonical_dtype(want_dtype) != _dtype_name(got):
                problems.append(f"output slot {index}: dtype {_dtype_name(got)} != expected "
                                f"{contract.canonical_dtype(want_dtype)}")
    # A 0-d output has no shape text (the contract cannot write one), so it is never an extra slot.
    extra = [i for i in range(len(slots.output_shapes), len(outputs)) if outputs[i] is not None and outputs[i].dim() > 0]
    if extra and spec.extra == "error":
        problems.append(f"the call produced {len(outputs)} outputs, the row has {len(slots.output_shapes)} "
                        "output slots (set outputs.extra: ignore in the definition if that is expected)")
    if problems:
        return VerifyResult(False, expected, produced, "; ".join(problems))
    return VerifyResult(True, expected, produced)
