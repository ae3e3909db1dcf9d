"""What the NPU hooks share: a call described before its API is resolved, and slot-by-slot tensor makers.

A hook module exposes `build_call(row, ctx) -> NpuCall` (pure tensor building, runs on any device,
so tests check it on the CPU) and `build_case(row, ctx) -> ReplayCase` (resolves the torch_npu /
custom-op API, which exists only on an Ascend host). Each module serves a family of kernel types:
`build_call, build_case = hook_entry_points({Type: builder, ...})`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opperf import contract
from opperf.replay.inputs import BuildContext, ReplayCase, describe_call, resolve_callable, torch_dtype

DEFAULT_IMPORTS = ("torch_npu",)


@dataclass
class NpuCall:
    """One kernel call, built but not bound to its API yet."""

    api: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    import_modules: tuple[str, ...] = DEFAULT_IMPORTS
    slot_tensors: dict[int, Any] = field(default_factory=dict)   # row input slot -> what was built for it
    # In-place kernels return nothing useful: `outputs(result)` gives the tensors to verify instead.
    outputs: Callable[[Any], Any] | None = None
    # Work that needs the device stack (process groups, Triton device properties), run before resolving.
    prepare: Callable[[NpuCall], None] | None = None
    notes: str = ""                                               # what was inferred, for the trace

    def describe(self) -> str:
        text = describe_call(self.api, self.args, self.kwargs)
        return f"{text}  [{self.notes}]" if self.notes else text


def to_case(call: NpuCall) -> ReplayCase:
    """Resolve the call's API (importing torch_npu / custom-op modules) into a ReplayCase."""
    if call.prepare is not None:
        call.prepare(call)
    api = resolve_callable(call.api, call.import_modules)
    if call.outputs is None:
        fn = api
    else:
        outputs = call.outputs

        def fn(*args, **kwargs):
            return outputs(api(*args, **kwargs))
    return ReplayCase(fn=fn, args=tuple(call.args), kwargs=dict(call.kwargs), description=call.describe())


Builder = Callable[[BuildContext], NpuCall]


def hook_entry_points(builders: Mapping[str, Builder]) -> tuple[Callable[..., NpuCall], Callable[..., ReplayCase]]:
    """A hook module's `build_call(row, ctx)` and `build_case(row, ctx)`, dispatching on the definition's Type."""

    def build_call(row: Mapping[str, str], ctx: BuildContext) -> NpuCall:
        kernel_type = ctx.definition.type if ctx.definition is not None else ""
        if kernel_type not in builders:
            raise ctx.error(f"hook has no builder for kernel type {kernel_type!r} (it builds {sorted(builders)})",
                            "type")
        return builders[kernel_type](ctx)

    def build_case(row: Mapping[str, str], ctx: BuildContext) -> ReplayCase:
        return to_case(build_call(row, ctx))

    return build_call, build_case


class Slots:
    """The row's slots, with makers that record what they built (for `NpuCall.slot_tensors`)."""

    def __init__(self, ctx: BuildContext):
        self.ctx = ctx
        self.built: dict[int, Any] = {}

    @property
    def count(self) -> int:
        return len(self.ctx.slots.input_shapes)

    def shape(self, index: int) -> tuple[int, ...] | None:
        """The slot's logical (ND) shape; None for an empty or absent slot."""
        return self.ctx.input_shape(index) if index < self.count else None

    def require(self, index: int, name: str) -> tuple[int, ...]:
        shape = self.shape(index)
        if shape is None:
            raise self.ctx.error(f"input slot {index} ({name}) is empty; this kernel needs it")
        return shape

    def dtype(self, index: int) -> torch.dtype:
        return self.ctx.input_dtype(index)

    def dtype_name(self, index: int) -> str:
        names = self.ctx.slots.input_dtypes
        return contract.canonical_dtype(names[index]) if index < len(names) and names[index] \
            and contract.is_known_dtype(names[index]) else ""

    def tensor(self, index: int, name: str, *, values: str = "normal", shape: Sequence[int] | None = None,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        """Random values of the slot's shape and dtype (or those given), cast to the slot's storage format."""
        shape = tuple(shape) if shape is not None else self.require(index, name)
        built = self.ctx.tensor(shape, dtype or self.dtype(index), values)
        self.built[index] = built
        return self.ctx.cast_format(built, index) if shape == self.shape(index) else built

    def optional(self, index: int, name: str, *, values: str = "normal") -> torch.Tensor | None:
        return None if self.shape(index) is None else self.tensor(index, name, values=values)

    def index(self, index: int, name: str, high: int, *, unique: bool = False, sorted_values: bool = False,
              shape: Sequence[int] | None = None) -> torch.Tensor:
        """Valid indices in [0, high) for the slot (never out of bounds)."""
        shape = tuple(shape) if shape is not None else self.require(index, name)
        built = self.ctx.index_tensor(shape, self.dtype(index), 0, high, unique=unique, sorted_values=sorted_values)
        self.built[index] = built
        return built

    def record(self, index: int, value: Any) -> Any:
        self.built[index] = value
        return value

    def output_shape(self, index: int) -> tuple[int, ...] | None:
        shapes = self.ctx.slots.output_shapes
        if index >= len(shapes) or shapes[index] is None:
            return None
        formats = self.ctx.slots.output_formats
        return contract.logical_shape(shapes[index], formats[index] if index < len(formats) else "")

    def require_output(self, index: int, name: str) -> tuple[int, ...]:
        shape = self.output_shape(index)
        if shape is None:
            raise self.ctx.error(f"output slot {index} ({name}) is empty; its shape is needed to rebuild the call",
                                 contract.OUTPUT_SHAPES)
        return shape

    def output_dtype(self, index: int) -> torch.dtype:
        names = self.ctx.slots.output_dtypes
        if index >= len(names) or not names[index]:
            raise self.ctx.error(f"output slot {index} has no data type", contract.OUTPUT_DTYPES)
        return torch_dtype(names[index], path=self.ctx.path, row=self.ctx.line, field=contract.OUTPUT_DTYPES)

    @property
    def output_count(self) -> int:
        return len(self.ctx.slots.output_shapes)

    def call(self, api: str, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None, **options) -> NpuCall:
        return NpuCall(api=api, args=tuple(args), kwargs=dict(kwargs or {}), slot_tensors=dict(self.built),
                       **options)


def split_evenly(total: int, parts: int, minimum: int = 1) -> list[int]:
    """`total` as `parts` near-equal integers, each >= minimum (sequence lengths, tokens per expert)."""
    if parts <= 0:
        return []
    if total < parts * minimum:
        raise ValueError(f"cannot split {total} into {parts} parts of at least {minimum}")
    base, extra = divmod(total - parts * minimum, parts)
    return [minimum + base + (1 if i < extra else 0) for i in range(parts)]


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)
