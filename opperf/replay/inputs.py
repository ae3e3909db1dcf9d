"""Build a kernel call from one database row: tensors from the row's shape/dtype/format strings.

Strict: shapes go through `contract.parse_shapes`, scalars through `parse_scalar` (a literal
grammar, never `eval`), dtypes through the contract's dtype table. FRACTAL_NZ storage shapes are
built as their ND matrix and handed to the back end's format cast (NPU only). Index-like inputs
hold values inside the bound their definition names, so a gather/scatter/cache-slot input never
reads or writes out of bounds. A slot with recorded `Input Strides` is built with exactly those
strides over a storage large enough for them (`as_strided`), as the workload laid it out: a
transposed weight, a chunk of a fused projection, an expanded (stride-0) index whose rows repeat.
Random values are drawn on the replay device (a seeded device generator): building a 2 GB input on
the host first would cost seconds per row.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from opperf import contract, input_values
from opperf.errors import OpperfError
from opperf.yaml_files import field_error
from opperf.grid.memory import tensor_bytes
from opperf.replay.definitions import IndexBound, InputSpec, KernelDefinition, Layout

# Canonical profiler dtype name → torch dtype.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "DT_BF16": torch.bfloat16, "DT_FLOAT16": torch.float16, "DT_FLOAT": torch.float32,
    "DT_DOUBLE": torch.float64, "DT_INT8": torch.int8, "DT_UINT8": torch.uint8, "DT_INT16": torch.int16,
    "DT_INT32": torch.int32, "DT_INT64": torch.int64, "DT_BOOL": torch.bool, "DT_COMPLEX64": torch.complex64,
    "DT_FLOAT8_E4M3FN": torch.float8_e4m3fn, "DT_FLOAT8_E5M2": torch.float8_e5m2,
}
# The reverse, for describing what a call produced in the row's own spelling.
PROFILER_DTYPES: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPES.items()}

# A 0-d slot of these dtypes with no recorded value was a Python number in the workload (torch wraps floats as
# double and ints as int64 in a 0-d CPU tensor, which a device kernel takes as an argument); replay passes such a
# CPU tensor (a Python number would pick the op's Scalar overload, a device tensor another kernel), non-zero as
# it may be a divisor.
WRAPPED_NUMBER_VALUES = {"DT_DOUBLE": 0.5, "DT_INT64": 2}

# Device memory the recorded-value variants of one input may take (a histogram's ids over 256k tokens x top-8 are
# 16 MiB a call): past it, fewer of the row's recorded calls are cycled through.
VALUE_VARIANT_BYTES = 256 * 2**20

# Format cast hook a back end supplies (NPU: torch_npu.npu_format_cast); CPU/CUDA keep ND.
FormatCast = Callable[[torch.Tensor, str], torch.Tensor]


@dataclass
class ReplayCase:
    """One ready-to-time call: `fn(*args, **kwargs)`; what hooks return from `build_case(row, ctx)`.

    `warm`: the inputs that were just written by the previous kernel in the workload (activations),
    made L2-resident before each timed call under the `insitu` policy; None means every tensor input.
    """

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    description: str = ""                 # what was built, for traces and error messages
    warm: tuple | None = None
    recipe: str = ""                      # `Replay Recipe` when the builder knows better than its definition
    profiled_power_w: float | None = None  # the GPU's power around the row's calls in the workload (NVML)
    profiled_us: float | None = None       # the call's device time in the workload (Profiling Average Duration)
    # id(tensor) → MiB the workload touched since that input's last use (the row's Profiling Input Reuse
    # Distance, opperf.replay.residency): where set, insitu holds in L2 what an LRU cache would, not `warm`.
    reuse: dict[int, float] = field(default_factory=dict)

    # Inputs whose values the workload recorded (BuildContext.recorded_input): before each call the timer copies
    # the next recorded call's values in (next_values), outside the timed range and before the cache preparation.
    value_variants: list = field(default_factory=list)
    value_turn: int = 0

    def run(self) -> Any:
        return self.fn(*self.args, **self.kwargs)

    def next_values(self) -> None:
        """Put the next recorded call's values into the inputs that have them (the first call used the first)."""
        if not self.value_variants:
            return
        self.value_turn += 1
        for target, variants in self.value_variants:
            target.copy_(variants[self.value_turn % len(variants)])

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor argument (tensor lists flattened), in call order."""
        found = []
        for value in (*self.args, *self.kwargs.values()):
            items = value if isinstance(value, (list, tuple)) else [value]
            found += [t for t in items if isinstance(t, torch.Tensor)]
        return found

    def warm_tensors(self) -> list[torch.Tensor]:
        return list(self.warm) if self.warm is not None else self.tensors()


# --- strict scalar literals -----------------------------------------------------------------------

_INT_RE = re.compile(r"^[+-]?\d+$")
_FLOAT_RE = re.compile(r"^[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$|^[+-]?(inf|nan)$")
_WORD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def parse_scalar(text: str, *, path=None, row=None, field=None) -> Any:
    """One `Input Scalars` slot as a Python value: `-1`, `0.`, `1e-06`, `True`, `[256, 128]`, `tanh`.

    '' means nothing was recorded (None). A literal grammar only (ints, floats, booleans, None,
    bare words, flat lists of those): anything else is an OpperfError naming the field.
    """
    text = text.strip()
    if text == "" or text == "None":
        return None
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        if inner == "":
            return []
        items = [parse_scalar(part, path=path, row=row, field=field) for part in inner.split(",")]
        if any(isinstance(item, list) for item in items):
            raise OpperfError(f"nested list in scalar {text!r}", path=path, row=row, field=field)
        return items
    if text in ("True", "true"):
        return True
    if text in ("False", "false"):
        return False
    if _INT_RE.match(text):
        return int(text)
    if _FLOAT_RE.match(text):
        return float(text)
    if _WORD_RE.match(text):
        return text
    raise OpperfError(f"cannot read scalar {text!r} (expected a number, True/False, a word or [a, b, ...])",
                      path=path, row=row, field=field)


# --- the row, slot by slot --------------------------------------------------------------------------

@dataclass(frozen=True)
class RowSlots:
    """A row's input and output slots, parsed: shapes (None = empty slot), dtypes, formats (upper case, without
    the older `FORMAT_` prefix: `FRACTAL_NZ`, `ND`), scalars."""

    input_shapes: list
    input_dtypes: list[str]
    input_formats: list[str]
    input_scalars: list[Any]
    input_strides: list                   # per slot: recorded non-contiguous strides, else None
    output_shapes: list
    output_dtypes: list[str]
    output_formats: list[str]


def _slot(values: Sequence[str], index: int) -> str:
    return values[index] if index < len(values) else ""


def _format_names(field_value: str) -> list[str]:
    return [name.upper().removeprefix("FORMAT_") for name in contract.parse_names(field_value)]


def parse_row_slots(row: Mapping[str, str], *, path=None, line=None) -> RowSlots:
    """Parse the shape/dtype/format/scalar fields of one row (errors name the file, line and field)."""
    input_shapes = contract.parse_shapes(row.get(contract.INPUT_SHAPES, ""), path=path, row=line,
                                         field=contract.INPUT_SHAPES)
    output_shapes = contract.parse_shapes(row.get(contract.OUTPUT_SHAPES, ""), path=path, row=line,
                                          field=contract.OUTPUT_SHAPES)
    scalars_text = contract.split_slots(row.get(contract.INPUT_SCALARS, ""))
    scalars = [parse_scalar(s, path=path, row=line, field=contract.INPUT_SCALARS) for s in scalars_text]
    strides = [contract.parse_strides(s, path=path, row=line)
               for s in contract.split_slots(row.get(contract.INPUT_STRIDES, ""))]
    for index, slot_strides in enumerate(strides):
        shape = input_shapes[index] if index < len(input_shapes) else None
        if slot_strides is not None and (shape is None or len(shape) != len(slot_strides)):
            raise OpperfError(f"slot {index} has strides {list(slot_strides)} but shape "
                              f"{list(shape) if shape is not None else 'none'} (one stride per dimension)",
                              path=path, row=line, field=contract.INPUT_STRIDES)
    return RowSlots(
        input_shapes=input_shapes,
        input_dtypes=contract.parse_names(row.get(contract.INPUT_DTYPES, "")),
        input_formats=_format_names(row.get(contract.INPUT_FORMATS, "")),
        input_scalars=scalars,
        input_strides=strides,
        output_shapes=output_shapes,
        output_dtypes=contract.parse_names(row.get(contract.OUTPUT_DTYPES, "")),
        output_formats=_format_names(row.get(contract.OUTPUT_FORMATS, "")),
    )


def torch_dtype(name: str, *, path=None, row=None, field=None) -> torch.dtype:
    canonical = contract.canonical_dtype(name, path=path, row=row, field=field)
    if canonical not in TORCH_DTYPES:
        raise OpperfError(f"data type {name!r} has no torch equivalent to build a tensor from", path=path,
                          row=row, field=field)
    return TORCH_DTYPES[canonical]


def storage_extent(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements a storage needs so that a view of `shape` with `strides` stays inside it."""
    if any(int(d) == 0 for d in shape):
        return 0
    return 1 + sum((int(d) - 1) * int(s) for d, s in zip(shape, strides))


def row_tensor_bytes(slots: RowSlots) -> int:
    """Bytes the row's input and output tensors occupy, for the memory budget check: the grid stage's count
    (`grid.memory.tensor_bytes`, unknown dtypes at its widest size) without its workspace margin; a strided
    input counts the storage its strides span."""
    total = 0
    for shapes, dtypes, formats, strides in ((slots.input_shapes, slots.input_dtypes, slots.input_formats,
                                              slots.input_strides),
                                             (slots.output_shapes, slots.output_dtypes, slots.output_formats, [])):
        for index, shape in enumerate(shapes):
            slot_strides = strides[index] if index < len(strides) else None
            if shape is not None and slot_strides is not None:
                shape = (storage_extent(shape, slot_strides),)
            total += tensor_bytes(shape, _slot(dtypes, index), _slot(formats, index))
    return total


# --- tensor construction ------------------------------------------------------------------------------

class BuildContext:
    """What a case builder (declarative or hook) needs: the row's slots, the device and tensor makers."""

    def __init__(self, definition: KernelDefinition | None, row: Mapping[str, str], device: str | torch.device,
                 *, format_cast: FormatCast | None = None, path=None, line: int | None = None, seed: int = 0):
        self.definition = definition
        self.row = row
        self.device = torch.device(device)
        self.format_cast = format_cast
        self.path = path
        self.line = line
        self.slots = parse_row_slots(row, path=path, line=line)
        self.generator = _device_generator(self.device, seed)
        # Inputs built from the workload's recorded values (opperf.input_values): (the tensor the call reads, the
        # variants replay copies into it before each call, one per recorded call in proportion).
        self.value_variants: list[tuple[torch.Tensor, list[torch.Tensor]]] = []

    # -- slot accessors
    def input_dtype(self, index: int) -> torch.dtype:
        override = self.definition.dtype_overrides.get(index) if self.definition else None
        name = override or _slot(self.slots.input_dtypes, index)
        if not name:
            raise OpperfError(f"input slot {index} has no data type", path=self.path, row=self.line,
                              field=contract.INPUT_DTYPES)
        return torch_dtype(name, path=self.path, row=self.line, field=contract.INPUT_DTYPES)

    def input_format(self, index: int) -> str:
        return _slot(self.slots.input_formats, index)

    def input_shape(self, index: int) -> tuple[int, ...] | None:
        """The slot's logical (ND) shape; None for an empty slot."""
        if index >= len(self.slots.input_shapes):
            return None
        return contract.logical_shape(self.slots.input_shapes[index], self.input_format(index))

    def scalar(self, index: int) -> Any:
        return self.slots.input_scalars[index] if index < len(self.slots.input_scalars) else None

    def input_strides(self, index: int) -> tuple[int, ...] | None:
        """The slot's recorded strides when the workload's tensor was not contiguous, else None."""
        return self.slots.input_strides[index] if index < len(self.slots.input_strides) else None

    def error(self, message: str, field_name: str = contract.INPUT_SHAPES) -> OpperfError:
        return OpperfError(message, path=self.path, row=self.line, field=field_name)

    def recorded_input(self, index: int, shape: Sequence[int] | None, dtype: torch.dtype,
                       op: str | None = None, end: int | None = None) -> torch.Tensor | None:
        """The slot built from the values the workload recorded for it (`Profiling Input Values`), cycling through
        the row's recorded calls; None where the row recorded none for this slot or they do not fit its shape
        (offsets: non-decreasing, within `end` where the caller knows the dimension they partition, a workload may
        leave padding rows past the last group; distinct indices: `end` is the dimension they index)."""
        cell = self.row.get(contract.PROFILING_INPUT_VALUES)
        if not cell or shape is None or self.input_strides(index) is not None:
            return None
        op = op or (self.definition.type if self.definition else "")
        kind = recorded_kind(op, index)
        if kind is None:
            return None
        # Named by field only: the message becomes the row's own Replay Error (no rows file path in a database).
        pairs = input_values.slot_calls(cell, index, where=f"field {contract.PROFILING_INPUT_VALUES!r}")
        shape = tuple(int(d) for d in shape)
        cycle = input_values.variant_cycle(pairs, VALUE_VARIANT_BYTES // max(math.prod(shape) * dtype.itemsize, 1))
        if not cycle:
            return None
        if kind == input_values.OFFSETS and any(values != sorted(values) or (end is not None and values
                                                                             and values[-1] > end) for values in cycle):
            return None
        built = [self._from_values(kind, values, shape, dtype, op, end) for values in cycle]
        if any(b is None for b in built):
            return None
        target = built[0].clone()
        self.value_variants.append((target, built))
        return target

    def _from_values(self, kind: str, values: list[int], shape: tuple[int, ...], dtype: torch.dtype,
                     op: str, end: int | None = None) -> torch.Tensor | None:
        count = math.prod(shape)
        if kind == input_values.OFFSETS:
            if len(values) != count or dtype.is_floating_point:
                return None
            return torch.tensor(values, dtype=dtype).reshape(shape).to(self.device)
        generator = torch.Generator().manual_seed(count)
        if kind == input_values.MASK:        # as many True as the workload's mask held, at seeded random places
            if len(values) != 1 or values[0] > count or dtype != torch.bool:
                return None
            flat = torch.zeros(count, dtype=torch.bool)
            flat[torch.randperm(count, generator=generator)[:values[0]]] = True
            return flat.reshape(shape).to(self.device)
        if kind == input_values.DISTINCT:    # that many distinct indices below `end`, each at least once, shuffled
            if (len(values) != 1 or end is None or not 0 < values[0] <= min(count, end) or dtype.is_floating_point
                    or dtype == torch.bool):
                return None
            chosen = torch.randperm(end, generator=generator)[:values[0]]
            extra = chosen[torch.randint(0, values[0], (count - values[0],), generator=generator)]
            flat = torch.cat([chosen, extra])[torch.randperm(count, generator=generator)]
            return flat.to(dtype).reshape(shape).to(self.device)
        counts = torch.tensor(values, dtype=torch.int64)
        outside = count - int(counts.sum())
        if outside < 0:
            return None
        if op == "histc":                    # a value inside each bin as often as it was counted, the rest above
            if self.scalar(1) != len(values):
                return None
            levels = histogram_levels(self.scalar(2), self.scalar(3), len(values), dtype.is_floating_point)
            if levels is None or any(c and level is None for c, level in zip(values, levels)):
                return None
            levels = torch.tensor([level if level is not None else 0 for level in levels], dtype=torch.float64)
        else:                                # bincount: each value as often as it was counted
            if outside:
                return None
            levels = torch.arange(len(values))
        flat = torch.repeat_interleave(levels, torch.cat([counts, torch.tensor([outside])])[:len(levels)])
        order = torch.randperm(count, generator=generator)
        return flat[order].to(dtype).reshape(shape).to(self.device)

    # -- makers
    def tensor(self, shape: Sequence[int], dtype: torch.dtype, values: str = "normal",
               strides: Sequence[int] | None = None) -> torch.Tensor:
        """A tensor of random (or constant) values drawn on the device; with `strides`, a view of exactly those
        strides over a storage that holds every element they reach (values fill the whole storage)."""
        shape = tuple(int(d) for d in shape)
        if strides is not None:
            storage = self.tensor((storage_extent(shape, strides),), dtype, values)
            return storage.as_strided(shape, tuple(int(s) for s in strides))
        options = {"device": self.device, "generator": self.generator}
        if values == "ones":
            return torch.ones(shape, dtype=dtype, device=self.device)
        if values == "zeros":
            return torch.zeros(shape, dtype=dtype, device=self.device)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, **options).bool()
        if dtype.is_floating_point or dtype.is_complex:
            base = torch.float32
            if values == "uniform":
                built = torch.rand(shape, dtype=base, **options)
            elif values == "positive":
                built = torch.rand(shape, dtype=base, **options) + 0.5
            else:
                built = torch.randn(shape, dtype=base, **options)
            return built.to(dtype)
        low, high = (1, 8) if values == "positive" else (-8, 8)
        if dtype == torch.uint8:
            low = max(low, 0)
        return torch.randint(low, high, shape, **options).to(dtype)

    def index_tensor(self, shape: Sequence[int], dtype: torch.dtype, low: int, high: int, *, unique: bool = False,
                     sorted_values: bool = False, strides: Sequence[int] | None = None,
                     field_name: str = contract.INPUT_SHAPES) -> torch.Tensor:
        """Integers in [low, high): valid indices for gather/index/scatter/cache slots/expert ids.

        With `strides` the values fill the storage the strides span, so a stride-0 (expanded) index repeats
        its values exactly as the workload's did (e.g. one token id per embedding row)."""
        if high <= low:
            raise self.error(f"index bound [{low}, {high}) is empty", field_name)
        shape = tuple(int(d) for d in shape)
        count = storage_extent(shape, strides) if strides is not None else math.prod(shape)
        options = {"device": self.device, "generator": self.generator}
        if unique:
            if count > high - low:
                raise self.error(f"{count} distinct indices do not fit in [{low}, {high})", field_name)
            values = torch.randperm(high - low, **options)[:count] + low
        else:
            values = torch.randint(low, high, (count,), **options)
        if sorted_values:
            values = values.sort().values
        values = values.to(dtype)
        if strides is not None:
            return values.as_strided(shape, tuple(int(s) for s in strides))
        return values.reshape(shape)

    def cast_format(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        fmt = self.input_format(index)
        if self.format_cast is not None and fmt not in ("", "ND", "NCHW", "NHWC"):
            return self.format_cast(tensor, fmt)
        return tensor


def histogram_levels(low, high, bins: int, floating: bool) -> list[float | None] | None:
    """A value inside each of histc's `bins` bins over [low, high] (its centre; for integers the smallest integer in
    it, None where it holds none), then one above the range; None where the range is not explicit."""
    if isinstance(low, bool) or isinstance(high, bool) or not isinstance(low, (int, float)) \
            or not isinstance(high, (int, float)) or high <= low or bins < 1:
        return None
    width = (high - low) / bins
    if floating:
        return [low + (i + 0.5) * width for i in range(bins)] + [high + width]
    levels = []
    for i in range(bins):
        value = math.ceil(low + i * width)
        inside = value < low + (i + 1) * width or (i == bins - 1 and value <= high)
        levels.append(float(value) if inside else None)
    return levels + [float(math.floor(high) + 1)]


def recorded_kind(op: str, index: int) -> str | None:
    """How input slot `index` of aten op `op` was recorded (opperf.input_values), by its schema argument's name."""
    recorded = input_values.recorded_arguments(op)
    if not recorded:
        return None
    packet = getattr(torch.ops.aten, op, None)
    # The tensor overloads of one op share the recorded arguments' positions (masked_fill_.Scalar/.Tensor: self,
    # mask); others do not (index.str), so the first overload that has a recorded argument there decides.
    overloads = sorted(packet.overloads(), key=lambda name: name != "default") if packet is not None else []
    for overload in overloads:
        arguments = getattr(getattr(packet, overload), "_schema").arguments
        if index < len(arguments) and arguments[index].name in recorded:
            return recorded[arguments[index].name]
    return None


class MetaBuildContext(BuildContext):
    """A BuildContext whose tensors are meta tensors: shapes, dtypes and strides only, no memory, no values
    (the schema check before a replay, the offline NPU check)."""

    def tensor(self, shape, dtype, values="normal", strides=None):
        shape = tuple(int(d) for d in shape)
        if strides is not None:
            return torch.empty_strided(shape, tuple(int(s) for s in strides), dtype=dtype, device="meta")
        return torch.empty(shape, dtype=dtype, device="meta")

    def recorded_input(self, index, shape, dtype, op=None, end=None):
        return None                      # values do not matter on meta tensors

    def index_tensor(self, shape, dtype, low, high, *, unique=False, sorted_values=False, strides=None,
                     field_name=contract.INPUT_SHAPES):
        if high <= low:
            raise self.error(f"index bound [{low}, {high}) is empty", field_name)
        if unique and math.prod(int(d) for d in shape) > high - low:
            raise self.error(f"{math.prod(int(d) for d in shape)} distinct indices do not fit in [{low}, {high})",
                             field_name)
        return self.tensor(shape, dtype, strides=strides)


# --- declarative builder ------------------------------------------------------------------------------

def _device_generator(device: torch.device, seed: int) -> torch.Generator:
    """A seeded generator on the replay device (the CPU one where the device has none of its own)."""
    try:
        return torch.Generator(device=device).manual_seed(seed)
    except RuntimeError:
        return torch.Generator(device="cpu").manual_seed(seed)


def resolve_callable(dotted: str, import_modules: Sequence[str] = ()) -> Callable[..., Any]:
    """`torch.ops.aten.mm` / `torch_npu.npu_rms_norm` → the callable (importing what it needs first)."""
    for module in import_modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise OpperfError(f"cannot import {module!r} (needed by {dotted}): {exc}") from exc
    parts = dotted.split(".")
    target = None
    for cut in range(len(parts), 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            try:
                target = getattr(target, attribute)
            except (AttributeError, RuntimeError) as exc:
                raise OpperfError(f"{dotted}: {'.'.join(parts[:cut])} has no attribute path "
                                  f"{'.'.join(parts[cut:])!r} ({exc})") from exc
        break
    if target is None:
        raise OpperfError(f"cannot import any module of {dotted!r}")
    if not callable(target):
        raise OpperfError(f"{dotted} is not callable")
    return target


def check_definition_resolves(definition: KernelDefinition) -> None:
    """The definition's modules import and its api exists in this environment, else an error naming its file
    and field: a broken definition fails every row alike, so it is the job's error, not each row's."""
    for module in definition.import_modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise field_error(f"cannot import {module!r}: {exc}", definition.path, "import_modules") from exc
    for api, where in ((definition.api, "api"), *((o.api, f"{o.where}.api") for o in definition.overloads)):
        if not api:
            continue
        try:
            resolve_callable(api)
        except OpperfError as exc:
            raise field_error(exc.reason, definition.path, where) from exc
    if definition.hook:
        try:
            module = importlib.import_module(definition.hook)
        except ImportError as exc:
            raise field_error(f"cannot import hook module {definition.hook!r}: {exc}", definition.path,
                              "hook") from exc
        if not callable(getattr(module, "build_case", None)):
            raise field_error(f"hook module {definition.hook!r} has no build_case(row, ctx)", definition.path, "hook")


def _index_high(bound: IndexBound, ctx: BuildContext, slot_index: int) -> int:
    if bound.constant is not None:
        return bound.constant
    if bound.scalar_slot is not None:
        value = ctx.scalar(bound.scalar_slot)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ctx.error(f"input slot {slot_index}'s index bound is Input Scalars slot {bound.scalar_slot}, which "
                            f"holds {value!r}, not a positive integer", contract.INPUT_SCALARS)
        return value
    shape = ctx.input_shape(bound.slot)
    if shape is None:
        raise ctx.error(f"input slot {slot_index}'s index bound refers to slot {bound.slot}, which is empty")
    if bound.dim_from_scalar_slot is not None:
        dim = ctx.scalar(bound.dim_from_scalar_slot)
        if isinstance(dim, list) and len(dim) == 1:
            dim = dim[0]
        if not isinstance(dim, int) or isinstance(dim, bool):
            raise ctx.error(f"input slot {slot_index}'s index bound needs an integer dim in Input Scalars slot "
                            f"{bound.dim_from_scalar_slot}, found {dim!r}", contract.INPUT_SCALARS)
    else:
        dim = bound.dim
    if not -len(shape) <= dim < len(shape):
        raise ctx.error(f"input slot {slot_index}'s index bound uses dim {dim} of slot {bound.slot}, "
                        f"which has shape {shape}")
    return shape[dim]


_NO_ARGUMENT = object()


def build_argument(spec: InputSpec, index: int, ctx: BuildContext) -> Any:
    """One slot as the value the call receives (or _NO_ARGUMENT when it is left out)."""
    shape = ctx.input_shape(index)
    if spec.role == "none":
        return _NO_ARGUMENT if spec.omit else None
    if spec.role == "scalar":
        if spec.scalar_from != "input_scalars":
            return spec.value
        value = ctx.scalar(index)
        # A keyword whose value the trace did not record (strings, for one) keeps the op's default.
        return _NO_ARGUMENT if value is None and spec.name else value
    if spec.role == "device":
        return ctx.device
    if spec.role == "dtype":
        return _recorded_dtype(spec, index, ctx)
    if spec.role == "index":
        if shape is None:
            raise ctx.error(f"input slot {index} is an index input but the row's slot is empty")
        high = _index_high(spec.high, ctx, index)
        recorded = ctx.recorded_input(index, shape, ctx.input_dtype(index), end=high if spec.low == 0 else None)
        if recorded is not None:
            return recorded
        return ctx.index_tensor(shape, ctx.input_dtype(index), spec.low, high, unique=spec.unique,
                                sorted_values=spec.sorted, strides=ctx.input_strides(index))
    # tensor
    if shape is None:
        # A 0-d tensor has no shape text: use the value the trace recorded; else, past the first (self) slot,
        # for double / int64 (the dtypes torch gives a wrapped Python number), a 0-d CPU tensor as torch wraps
        # one; else a 0-d tensor of the slot's dtype on the device; else None (an optional tensor that was absent).
        recorded = ctx.scalar(index)
        if recorded is not None:
            return recorded
        dtype_name = _slot(ctx.slots.input_dtypes, index)
        if dtype_name and contract.is_known_dtype(dtype_name):
            canonical = contract.canonical_dtype(dtype_name)
            if index > 0 and canonical in WRAPPED_NUMBER_VALUES:
                return torch.tensor(WRAPPED_NUMBER_VALUES[canonical], dtype=TORCH_DTYPES[canonical])
            return ctx.tensor((), ctx.input_dtype(index), spec.values)
        return None
    strides = ctx.input_strides(index)
    if strides is not None:         # the workload's own layout: it says everything a transpose would
        return ctx.cast_format(ctx.tensor(shape, ctx.input_dtype(index), spec.values, strides=strides), index)
    built = ctx.tensor(shape, ctx.input_dtype(index), spec.values)
    if spec.transpose is not None:
        if len(shape) < 2:
            raise ctx.error(f"input slot {index} has shape {shape}; transpose {list(spec.transpose)} needs rank >= 2")
        built = built.transpose(*spec.transpose)
        if spec.contiguous:
            built = built.contiguous()
    return ctx.cast_format(built, index)


def _recorded_dtype(spec: InputSpec, index: int, ctx: BuildContext) -> Any:
    """A `dtype` slot: the ScalarType the trace recorded (its code, 6 = float32, or a torch dtype's name); a
    keyword the trace did not record is left out, so the op's default applies."""
    recorded = ctx.scalar(index)
    if recorded is None:
        return _NO_ARGUMENT if spec.name else None
    name = recorded if isinstance(recorded, str) else contract.SCALAR_TYPE_NAMES.get(recorded)
    dtype = getattr(torch, str(name).removeprefix("torch."), None) if name and not isinstance(recorded, bool) \
        else None
    if not isinstance(dtype, torch.dtype):
        raise ctx.error(f"input slot {index} is a dtype, but the row recorded {recorded!r} (expected a ScalarType "
                        f"code such as 6, or a dtype name such as float32)", contract.INPUT_SCALARS)
    return dtype


def row_layout(definition: KernelDefinition, ctx: BuildContext) -> Layout:
    """The definition's layout for the row's slot count (`inputs`, or one of its `overloads`)."""
    slot_count = contract.input_slot_count(ctx.row)
    layout = definition.layout_for(slot_count)
    if layout is None:
        raise ctx.error(f"the row has {slot_count} input slots; the definition takes {definition.slot_counts_text()}")
    return layout


def declarative_arguments(definition: KernelDefinition, ctx: BuildContext) -> tuple[list, dict, list]:
    """The call's positional and keyword arguments from the definition's layout for the row (`inputs` or an
    `overloads` entry) and `kwargs`, and the tensors among them that are warm (`cache: warm`) in the workload.
    Shared with the offline NPU check."""
    slot_count = contract.input_slot_count(ctx.row)
    args, kwargs, warm = [], dict(definition.kwargs), []
    for index, spec in enumerate(row_layout(definition, ctx).inputs[:slot_count]):
        value = build_argument(spec, index, ctx)
        if value is _NO_ARGUMENT:
            continue
        if spec.name:
            kwargs[spec.name] = value
        else:
            args.append(value)
        if isinstance(value, torch.Tensor) and spec.cache == "warm":
            warm.append(value)
    return args, kwargs, warm


def build_declarative_case(definition: KernelDefinition, ctx: BuildContext) -> ReplayCase:
    """A ReplayCase from the definition's layout for the row, its `kwargs` and its `api`; the recipe names an
    `overloads` entry where one built the call."""
    layout = row_layout(definition, ctx)
    args, kwargs, warm = declarative_arguments(definition, ctx)
    fn = resolve_callable(layout.api, definition.import_modules)
    return ReplayCase(fn=fn, args=tuple(args), kwargs=kwargs, description=describe_call(layout.api, args, kwargs),
                      warm=tuple(warm), recipe="" if layout.where == "inputs" else f"{definition.recipe} {layout.where}")


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"Tensor{tuple(value.shape)}:{str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(describe_value(v) for v in value) + "]"
    return repr(value)


def describe_call(api: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str:
    parts = [describe_value(a) for a in args] + [f"{k}={describe_value(v)}" for k, v in kwargs.items()]
    return f"{api}({', '.join(parts)})"


def build_case(definition: KernelDefinition, row: Mapping[str, str], device: str | torch.device, *,
               format_cast: FormatCast | None = None, path=None, line: int | None = None, seed: int = 0) -> ReplayCase:
    """The call that replays `row`: the definition's hook if it has one, else the declarative recipe."""
    ctx = BuildContext(definition, row, device, format_cast=format_cast, path=path, line=line, seed=seed)
    if definition.hook:
        try:
            module = importlib.import_module(definition.hook)
        except ImportError as exc:
            raise OpperfError(f"cannot import hook module {definition.hook!r}: {exc}", path=definition.path,
                              field="hook") from exc
        builder = getattr(module, "build_case", None)
        if builder is None:
            raise OpperfError(f"hook module {definition.hook!r} has no build_case(row, ctx)", path=definition.path,
                              field="hook")
        case = builder(row, ctx)
        if not isinstance(case, ReplayCase):
            raise OpperfError(f"{definition.hook}.build_case returned {type(case).__name__}, not a ReplayCase",
                              path=definition.path, field="hook")
    else:
        case = build_declarative_case(definition, ctx)
    case.value_variants = case.value_variants or ctx.value_variants
    return case
