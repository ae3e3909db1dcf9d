"""Replay any op whose schema torch knows, with no kernel definition: arguments from the schema and the row.

A torch.profiler trace records every argument of an op call in schema order (keyword-only ones too): a
tensor's shape, dtype and strides, a number's or list's value, an empty slot for what it does not record
(`Tensor?[]`, strings, generators, absent optionals). So the op's schema (`torch.ops.<ns>.<op>.<overload>
._schema`) says what each slot of a row is, and the row says the rest:

1. **Bind.** Every overload whose arguments fit the row's slots (a TensorList takes as many leading tensor
   slots as the list had members; a tensor argument needs a tensor slot, a number argument an empty one).
2. **Check on meta tensors.** Each binding is called on meta tensors (shapes and dtypes, no memory, no
   values) and its outputs compared with the row's Output Shapes / Output Data Types; the first overload that
   reproduces them is the one replayed (an overload without a meta kernel is taken only if none verifies).
3. **Build on the device**, values chosen from the argument's type and name so that the call is valid and
   does the workload's work: an `index`/`indices` tensor stays below the dimension it indexes (`dim`, or the
   table's first dimension for embedding-like ops); a `Tensor?[]` index list the trace does not record is
   rebuilt from the output's shape (`x[idx]`: one index tensor over the leading dimension, bounded by it);
   offsets and cumulative lengths (`offs`, `cu_seqlens*`, `*start_loc*`) are non-decreasing and end at the
   dimension they partition (`_grouped_mm`: the rows of its 2-D operand, i.e. tokens per expert, split as a
   uniformly random router splits them; sequence lengths evenly);
   expert ids stay below the expert count; `bincount` input stays below the recorded output length; bool
   tensors are random masks; other integer tensors stay in [1, smallest other dimension) (valid as an index
   anywhere, never a zero divisor). Arguments named `weight`, `bias`, `mat2` are cold in the workload's cache,
   everything else warm (see the insitu cache policy).

A kernel definition under config/kernels/ stays the refinement where a schema cannot say enough (cache state
of a specific slot, value ranges, a hook for ops like FIA); a row replayed from its schema records
`schema <ns>::<op>.<overload>` in `Replay Recipe`, a defined one `definition <file>`.
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any

import torch

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.definitions import OutputSpec, schema_definition, schema_op_for
from opperf.replay.inputs import (TORCH_DTYPES, WRAPPED_NUMBER_VALUES, BuildContext, MetaBuildContext, ReplayCase,
                                  describe_call)
from opperf.replay.verify import verify_outputs

# Libraries that register a namespace's ops when imported (torch.ops.<ns> is empty until then).
NAMESPACE_MODULES = {"npu": ("torch_npu",), "atb": ("torch_npu",), "_C": ("vllm._C",), "_moe_C": ("vllm._moe_C",),
                     "vllm": ("vllm",), "_C_ascend": ("vllm_ascend", "vllm_ascend.vllm_ascend_C")}
# Arguments a model reads from memory rather than from the previous kernel's output (insitu: left cold).
COLD_ARGUMENTS = frozenset({"weight", "bias", "mat2", "weights", "embedding", "table"})
INDEX_ARGUMENTS = frozenset({"index", "indices", "idx", "ids", "input_ids", "token_ids"})
EXPERT_COUNT_ARGUMENTS = ("num_experts", "global_num_experts", "n_experts", "expert_num", "num_expert",
                          "local_num_experts")
# Ops whose float input must be positive for the call to do its normal work (no NaN paths).
POSITIVE_INPUT_OPS = frozenset({"log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "acosh",
                                "log_", "sqrt_", "rsqrt_", "reciprocal_", "pow_"})
OFFSET_DEFAULT = OutputSpec(verify=True, extra="ignore")
_WRAPPED_TYPES = ("ScalarType", "Layout", "MemoryFormat", "Generator", "Device")


class NoSchemaError(OpperfError):
    """torch knows no op of this name here (its library is not loaded): the row has no recipe at all."""


def op_packet(op_name: str):
    """torch.ops.<ns>.<op> (importing the library that registers <ns> first); an OpperfError if torch lacks it."""
    namespace, _, name = op_name.partition("::")
    if namespace != "aten":
        for module in NAMESPACE_MODULES.get(namespace, ()):
            try:
                importlib.import_module(module)
            except ImportError:
                continue
    try:
        return getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        hint = NAMESPACE_MODULES.get(namespace)
        raise NoSchemaError(f"no definition, and torch knows no op {op_name}" + (f" (its library {hint[0]} is not importable here)"
                                                           if hint else "")) from None


# --- binding: which slot is which argument ----------------------------------------------------------------------

@dataclass(frozen=True)
class Binding:
    """One overload and, per schema argument, the row's slot indices it takes (a TensorList: its members)."""

    overload: Any                              # torch._ops.OpOverload
    slots: tuple[tuple[int, ...], ...]

    @property
    def name(self) -> str:
        schema = self.overload._schema
        return f"{schema.name}.{schema.overload_name or 'default'}"


def _type_text(argument) -> str:
    return str(argument.real_type if hasattr(argument, "real_type") else argument.type)


def _is_tensor_list(type_text: str) -> bool:
    """Tensor[] or Tensor?[]: the parse gives each member a slot of its own (an unrecorded Tensor?[]: one empty)."""
    return type_text in ("List[Tensor]", "Tensor[]", "List[Optional[Tensor]]", "Tensor?[]")


def _slot_count(ctx: BuildContext) -> int:
    slots = ctx.slots
    return max(len(slots.input_shapes), len(slots.input_dtypes), len(slots.input_scalars))


def _holds_tensor(ctx: BuildContext, index: int) -> bool:
    """A tensor slot: a recorded shape, or a recorded dtype (a 0-d tensor has no shape text)."""
    if ctx.input_shape(index) is not None:
        return True
    dtypes = ctx.slots.input_dtypes
    return index < len(dtypes) and bool(dtypes[index])


def _fits_slot(type_text: str, ctx: BuildContext, index: int) -> bool:
    tensor = _holds_tensor(ctx, index)
    if type_text == "Tensor":
        return tensor
    if type_text == "Optional[Tensor]":
        return True
    if type_text in ("number", "Scalar"):      # a wrapped Python number is a 0-d double/int64 tensor slot
        return not tensor or ctx.input_shape(index) is None
    if "Tensor" in type_text:                  # Tensor?[] (index lists): recorded as one empty slot
        return not tensor
    return not tensor


def bindings(packet, ctx: BuildContext) -> list[Binding]:
    """Every overload of `packet` whose arguments fit the row's slots, the `default` overload first."""
    count = _slot_count(ctx)
    names = sorted(packet.overloads(), key=lambda o: (o != "default", o))
    found = []
    for name in names:
        overload = getattr(packet, name)
        arguments = list(overload._schema.arguments)
        lists = [i for i, a in enumerate(arguments) if _is_tensor_list(_type_text(a))]
        members = count - (len(arguments) - 1) if lists else 1
        if len(lists) > 1 or (not lists and len(arguments) != count) or members < 1:
            continue
        slots, cursor, fits = [], 0, True
        for position, argument in enumerate(arguments):
            width = members if position in lists else 1
            taken = tuple(range(cursor, cursor + width))
            cursor += width
            if position in lists:
                unrecorded = "Optional" in _type_text(argument) and width == 1 and not _holds_tensor(ctx, taken[0])
                fits = unrecorded or all(_holds_tensor(ctx, i) for i in taken)
            else:
                fits = _fits_slot(_type_text(argument), ctx, taken[0])
            if not fits:
                break
            slots.append(taken)
        if fits:
            found.append(Binding(overload, tuple(slots)))
    return found


# --- values ------------------------------------------------------------------------------------------------------

class _Values:
    """Builds one binding's arguments in a context (the device's, or meta for the check)."""

    def __init__(self, binding: Binding, ctx: BuildContext, op_short_name: str):
        self.binding, self.ctx, self.op = binding, ctx, op_short_name
        self.arguments = list(binding.overload._schema.arguments)
        self.by_name = {a.name: (a, s) for a, s in zip(self.arguments, binding.slots)}
        self.warm: list[torch.Tensor] = []

    # -- what the row says about other arguments
    def scalar_of(self, name: str):
        if name not in self.by_name:
            return None
        _, slots = self.by_name[name]
        return self.ctx.scalar(slots[0])

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        if name not in self.by_name:
            return None
        _, slots = self.by_name[name]
        return self.ctx.input_shape(slots[0]) if len(slots) == 1 else None

    def first_tensor_shape(self, *, skip: str, floating: bool = False) -> tuple[int, ...] | None:
        for argument, slots in zip(self.arguments, self.binding.slots):
            if argument.name == skip or len(slots) != 1:
                continue
            shape = self.ctx.input_shape(slots[0])
            if shape is None:
                continue
            if floating and not self.ctx.input_dtype(slots[0]).is_floating_point:
                continue
            return shape
        return None

    def other_dims(self, skip: str) -> list[int]:
        dims = []
        for argument, slots in zip(self.arguments, self.binding.slots):
            if argument.name == skip:
                continue
            for index in slots:
                dims += [d for d in (self.ctx.input_shape(index) or ()) if d > 0]
        return dims

    def output_shape(self, index: int = 0) -> tuple[int, ...] | None:
        shapes = self.ctx.slots.output_shapes
        return shapes[index] if index < len(shapes) else None

    # -- building
    def build(self) -> tuple[list, dict]:
        args, kwargs, keyword_from_here = [], {}, False
        for argument, slots in zip(self.arguments, self.binding.slots):
            value = self.value(argument, slots)
            if value is _OMIT:
                keyword_from_here = True
                continue
            if argument.kwarg_only or keyword_from_here:
                kwargs[argument.name] = value
            else:
                args.append(value)
        return args, kwargs

    def value(self, argument, slots: tuple[int, ...]):
        type_text = _type_text(argument)
        ctx = self.ctx
        if _is_tensor_list(type_text) and "Optional" in type_text:
            if not _holds_tensor(ctx, slots[0]):
                return self.index_list(argument, slots[0])
            return [self.index_member(argument, position, i) for position, i in enumerate(slots)]
        if _is_tensor_list(type_text):
            return [self.tensor(argument, i) for i in slots]
        index = slots[0]
        if "Tensor" in type_text:
            if ctx.input_shape(index) is None:
                return self.zero_dim(argument, index)
            return self.tensor(argument, index)
        recorded = ctx.scalar(index)
        if any(t in type_text for t in _WRAPPED_TYPES):
            if "ScalarType" in type_text and isinstance(recorded, int) and not isinstance(recorded, bool):
                return _scalar_type(recorded)
            if "Device" in type_text:
                return ctx.device
            return None if argument.has_default_value() or type_text.startswith("Optional") else _OMIT
        if recorded is None:
            if argument.has_default_value():
                return _OMIT
            if type_text.startswith("Optional"):
                return None
            raise ctx.error(f"argument {argument.name!r} ({type_text}) of {self.binding.name} has no recorded value",
                            contract.INPUT_SCALARS)
        if type_text in ("float", "Optional[float]") and isinstance(recorded, int) and not isinstance(recorded, bool):
            return float(recorded)
        return recorded

    def zero_dim(self, argument, index: int):
        """A tensor slot without shape text: a recorded value, a wrapped Python number, a 0-d tensor, or None."""
        ctx = self.ctx
        recorded = ctx.scalar(index)
        if recorded is not None:
            return recorded
        dtypes = ctx.slots.input_dtypes
        name = dtypes[index] if index < len(dtypes) else ""
        if name and contract.is_known_dtype(name):
            canonical = contract.canonical_dtype(name)
            if index > 0 and canonical in WRAPPED_NUMBER_VALUES:
                return torch.tensor(WRAPPED_NUMBER_VALUES[canonical], dtype=TORCH_DTYPES[canonical])
            return ctx.tensor((), ctx.input_dtype(index))
        return None

    def tensor(self, argument, index: int) -> torch.Tensor:
        ctx = self.ctx
        shape, dtype, strides = ctx.input_shape(index), ctx.input_dtype(index), ctx.input_strides(index)
        end = self.partitioned_size(argument.name) if self._is_offsets(argument.name) else None
        recorded = ctx.recorded_input(index, shape, dtype, self.op, end)
        if recorded is not None:        # the workload's own values (a MoE split), cycled through per call
            built = recorded
        elif dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            values = "positive" if self.op in POSITIVE_INPUT_OPS and index == 0 else "normal"
            built = ctx.tensor(shape, dtype, values, strides=strides)
        else:
            built = self.integer_tensor(argument, shape, dtype, strides)
        if argument.name not in COLD_ARGUMENTS:
            self.warm.append(built)
        return built

    def integer_tensor(self, argument, shape, dtype, strides) -> torch.Tensor:
        """Integers valid for what the argument is, by its name (see the module docstring)."""
        ctx, name = self.ctx, argument.name
        count = math.prod(shape)
        if self._is_offsets(name):
            return self.offsets(shape, dtype, name)
        if self.op == "bincount" and name == "self":
            length = (self.output_shape() or (0,))[0] if self.output_shape() else 0
            length = length or max(int(self.scalar_of("minlength") or 0), 1)
            built = ctx.index_tensor(shape, dtype, 0, length, strides=strides)
            if count:
                built.view(-1)[-1:] = length - 1      # the output has exactly `length` bins, as recorded
            return built
        high = self.index_bound(name)
        if high is not None:
            return ctx.index_tensor(shape, dtype, 0, high, strides=strides)
        dims = self.other_dims(name)
        high = max(min(dims) if dims else 8, 2)
        return ctx.index_tensor(shape, dtype, 1, high, strides=strides)

    def index_bound(self, name: str) -> int | None:
        """The exclusive bound of an index-like integer argument, or None when its name says no index."""
        lowered = name.lower()
        if "expert" in lowered or lowered in ("topk_ids", "topk_indices", "expert_ids"):
            for count_name in EXPERT_COUNT_ARGUMENTS:
                value = self.scalar_of(count_name)
                if isinstance(value, int) and value > 0:
                    return value
            for argument, slots in zip(self.arguments, self.binding.slots):
                shape = self.ctx.input_shape(slots[0]) if len(slots) == 1 else None
                if shape is not None and len(shape) == 3 and argument.name != name:
                    return shape[0]            # stacked expert weights [experts, ...]
            return None
        if lowered == "positions":
            cache = self.shape_of("cos_sin_cache")
            return cache[0] if cache else None
        if lowered not in INDEX_ARGUMENTS:
            return None
        dim = self.scalar_of("dim")
        source = self.shape_of("self") or self.shape_of("input") or self.first_tensor_shape(skip=name,
                                                                                             floating=True)
        if source is None:
            return None
        if isinstance(dim, int) and not isinstance(dim, bool) and -len(source) <= dim < len(source):
            return source[dim]
        return source[0] if source else None

    @staticmethod
    def _is_offsets(name: str) -> bool:
        lowered = name.lower()
        return lowered in ("offs", "offsets", "group_list", "cumsum") or lowered.startswith(("cu_seqlens", "cumulative")) \
            or "start_loc" in lowered

    def offsets(self, shape, dtype, name: str) -> torch.Tensor:
        """Non-decreasing offsets that end at the dimension they partition.

        Sequence offsets (`cu_seqlens*`, `*start_loc*`) split it as evenly as integers allow. Expert groups
        (`offs`, `group_list`, ...) are what a router makes of the tokens: each routed row goes to an expert
        drawn uniformly at random (a balanced router in expectation, seeded by the row's sizes so a row
        always replays the same split). An even split would be wrong for grouped GEMMs: with every group a
        whole number of tiles it launches fewer tiles than any real routing does (measured on an H100:
        Mixtral-class prefill at 512 tokens ran 1.43x the even split's time).
        """
        groups = math.prod(shape)
        total = self.partitioned_size(name)
        leading_zero = name.lower().startswith("cu_") or "start_loc" in name.lower()
        if leading_zero or groups < 2:
            values = even_offsets(total, groups, leading_zero=leading_zero)
        else:
            values = routed_offsets(total, groups)
        return torch.tensor(values, dtype=dtype, device=self.ctx.device).reshape(shape)

    def partitioned_size(self, name: str) -> int:
        if self.op == "_grouped_mm":
            a, b = self.shape_of("self"), self.shape_of("mat2")
            if a is not None and b is not None:
                if len(a) == 2 and len(b) == 3:
                    return a[0]             # tokens, grouped by expert
                if len(a) == 3 and len(b) == 2:
                    return b[-1]
                if len(a) == 2 and len(b) == 2:
                    return a[1]             # the reduction dimension, grouped
        shape = self.first_tensor_shape(skip=name, floating=True) or self.first_tensor_shape(skip=name)
        return shape[0] if shape else 0

    def index_member(self, argument, position: int, index: int) -> torch.Tensor:
        """Member `position` of an index list indexes dimension `position` of self: below its size (bool: a mask)."""
        ctx = self.ctx
        shape, dtype = ctx.input_shape(index), ctx.input_dtype(index)
        if dtype == torch.bool or shape is None:
            return self.tensor(argument, index)
        source = self.shape_of("self") or ()
        high = source[position] if position < len(source) else max(self.other_dims(argument.name) or [2])
        # The workload's number of distinct indices where it was recorded (a permutation reads every row once).
        built = ctx.recorded_input(index, shape, dtype, self.op, high) if position == 0 else None
        if built is None:
            built = ctx.index_tensor(shape, dtype, 0, high, strides=ctx.input_strides(index))
        self.warm.append(built)
        return built

    def index_list(self, argument, index: int):
        """`Tensor?[] indices` (index, index_put_): not recorded, rebuilt as one index tensor over the leading
        dimension whose shape makes the output (index) or the values (index_put_) come out as recorded."""
        ctx = self.ctx
        source = self.shape_of("self")
        if source is None or not source:
            raise ctx.error(f"{self.binding.name}: cannot rebuild `{argument.name}` without a shaped self")
        rest = tuple(source[1:])
        target = self.shape_of("values") if "values" in self.by_name else self.output_shape()
        if target is None:
            raise ctx.error(f"{self.binding.name}: cannot rebuild `{argument.name}`: no output/values shape recorded",
                            contract.OUTPUT_SHAPES)
        target = tuple(target)
        if len(target) >= len(rest) and target[len(target) - len(rest):] == rest and len(target) > len(rest):
            index_shape = target[:len(target) - len(rest)]
            return [ctx.index_tensor(index_shape, torch.int64, 0, source[0])]
        # A broadcast value (x[mask] = v): a mask over the whole tensor.
        return [ctx.tensor(source, torch.bool)]


_OMIT = object()


def even_offsets(total: int, groups: int, *, leading_zero: bool = False) -> list[int]:
    """`groups` non-decreasing offsets splitting `total` as evenly as integers allow: group ends, or with
    `leading_zero` group starts plus the end (`cu_seqlens`: 0, ..., total)."""
    steps = groups - 1 if leading_zero else groups
    return [round(total * (i + (0 if leading_zero else 1)) / max(steps, 1)) for i in range(groups)]


def routed_offsets(total: int, groups: int) -> list[int]:
    """Cumulative group ends of `total` rows routed uniformly at random over `groups` experts (seeded by both)."""
    generator = torch.Generator().manual_seed(total * 1_000_003 + groups)
    experts = torch.randint(0, groups, (total,), generator=generator)
    return torch.bincount(experts, minlength=groups).cumsum(0).tolist()


def _scalar_type(code: int):
    name = contract.SCALAR_TYPE_NAMES.get(code)
    return getattr(torch, name) if name and hasattr(torch, name) else None


# --- the hook --------------------------------------------------------------------------------------------------

def _short_name(op_name: str) -> str:
    return op_name.partition("::")[2]


def choose_binding(packet, row, ctx: BuildContext, op_name: str) -> Binding:
    """The overload whose call on meta tensors reproduces the row's outputs (see the module docstring)."""
    candidates = bindings(packet, ctx)
    if not candidates:
        raise ctx.error(f"no overload of {op_name} takes the row's {_slot_count(ctx)} input slots "
                        f"({', '.join(str(getattr(packet, o)._schema) for o in packet.overloads())[:400]})")
    meta = MetaBuildContext(ctx.definition, row, "meta", path=ctx.path, line=ctx.line)
    problems, unchecked = [], None
    for binding in candidates:
        try:
            args, kwargs = _Values(binding, meta, _short_name(op_name)).build()
            with torch.no_grad():
                produced = binding.overload(*args, **kwargs)
        except NotImplementedError as exc:          # no meta kernel: checked on the device by verify instead
            unchecked = unchecked or binding
            problems.append(f"{binding.name}: no meta kernel ({str(exc).splitlines()[0][:120]})")
            continue
        except Exception as exc:  # noqa: BLE001 — this overload does not take these arguments: try the next
            if "data-dependent" in str(exc).lower() or "DataDependent" in type(exc).__name__:
                unchecked = unchecked or binding
            problems.append(f"{binding.name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                            if str(exc).strip() else f"{binding.name}: {type(exc).__name__}")
            continue
        verdict = verify_outputs(row, meta.slots, produced, OFFSET_DEFAULT)
        if verdict.ok:
            return binding
        problems.append(f"{binding.name}: {verdict.message}")
    if unchecked is not None:
        return unchecked
    raise ctx.error(f"no overload of {op_name} reproduces the row on meta tensors: " + "; ".join(problems)[:600])


def build_case(row, ctx: BuildContext) -> ReplayCase:
    """The call of the row's op built from its schema (the hook of every schema-driven definition)."""
    op_name = ctx.definition.schema_op
    packet = op_packet(op_name)
    binding = choose_binding(packet, row, ctx, op_name)
    values = _Values(binding, ctx, _short_name(op_name))
    args, kwargs = values.build()
    api = f"torch.ops.{op_name.replace('::', '.')}.{binding.overload._schema.overload_name or 'default'}"
    return ReplayCase(fn=binding.overload, args=tuple(args), kwargs=kwargs, description=describe_call(api, args, kwargs),
                      warm=tuple(values.warm), recipe=f"schema {binding.name}")


def recipe_of(kernel_type: str, row, backend: str) -> str:
    """`schema aten::cumsum.default`: which overload a row replays from (for tests and the offline check)."""
    ctx = MetaBuildContext(schema_definition(kernel_type, (backend,)), row, "meta")
    op_name = schema_op_for(kernel_type)
    return f"schema {choose_binding(op_packet(op_name), row, ctx, op_name).name}"
