"""torch.profiler Chrome traces (CPU, CUDA or ROCm, `record_shapes=True`) → the per-kernel row form of kernel_details.

Which op a row stands for:
- GPU trace (it has device `kernel`/`gpu_memcpy`/`gpu_memset` events): the innermost `cpu_op` around the
  runtime call (`cudaLaunchKernel`, `hipLaunchKernel`, …) whose correlation id the device activity carries; its
  Duration(us) is the sum of its device activities' durations. Ops that launched nothing have no device time:
  skipped.
- Never a row (`op_exclusion`): collectives (`record_param_comms`, `c10d::*`, and every NCCL/RCCL kernel: the comm
  stage measures them), torch.compile regions (`CompiledFunction`: their kernels become rows by kernel name where
  that can be a Type), events that are no dispatcher op (`torch::autograd::CppNode<…>`: likewise), ops recorded
  without shapes. A trace in which no op has shapes is refused.
- CPU trace: there is no launch to follow, so a row is an innermost *compute* op: a `cpu_op` that is not a
  pure view/allocation/metadata op (VIEW_AND_ALLOCATION_OPS), has at least one tensor operand of rank ≥ 1,
  and has no such op inside it. Its Duration(us) is its wall time. Composite ops (aten::linear → addmm)
  are represented by their innermost parts, never twice.

Type is the op name without `aten::` (`aten::mm` → `mm`; other namespaces `ns::op` → `ns.op`). Input
slots follow the recorded arguments: a tensor gives its dims, a tensor list one slot per tensor, anything
else an empty slot whose `Concrete Inputs` value goes into the `Input Scalars` column (slot-aligned).
The recorded `Input Strides` of non-contiguous tensor slots go into the `Input Strides` column
(`contract.strides_text`): a transposed weight or a chunk of a fused projection is another call than
its contiguous twin.
torch.profiler records no dtype for the tensors of a TensorList (cat's inputs): they get the reference workload's
`workload.json` dtype, else one the trace does record (the op's child ops, the launched kernel's name, the
trace's dominant floating dtype: `_list_member_dtype`). An index op's `Tensor?[] indices`, recorded as one empty
slot, is rebuilt from the index tensors the op reshapes inside itself (`_with_index_lists`).
GPU traces also get an attribution account: the share of the trace's device time that became rows and what the
rest was (collectives, compiled regions, graph replays, Triton kernels, memcpy/memset outside any op;
opperf.parse.attribution.Attribution, which the parse stage completes with the rows it then skips); a kernel no op
launched gets a row of its own, by its name, where the name can be a Type.
Output shapes and dtypes are not in the trace: they are inferred by calling the same aten op on `meta`
tensors (shape inference, no compute) with the recorded scalars; when that fails they stay empty and the
failure is counted (torch <= 2.0 records no scalars, `Concrete Inputs`: warned). Formats are `ND` per tensor slot,
OP State `eager`, Accelerator Core `CPU`, `CUDA` or `ROCM` (`_device_core`).
"""

from __future__ import annotations

import ast
import bisect
import csv
import gzip
import json
import logging
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from opperf.contract import (ACCELERATOR_CORE, BASE_COLUMNS, EXECUTION_TRACE, INPUT_DTYPES, INPUT_FORMATS,
                             INPUT_SCALARS, INPUT_SHAPES, INPUT_STRIDES, OP_STATE, OUTPUT_DTYPES, OUTPUT_FORMATS,
                             OUTPUT_SHAPES, PROFILING_INPUT_REUSE, PROFILING_INPUT_VALUES, WORKLOAD_MANIFEST, strides_text,
                             PROFILER_TYPE_TO_TORCH, SCALAR_TYPE_NAMES, TORCH_TO_PROFILER_DTYPE, dtype_bytes,
                             kernel_type_problem)
from opperf.errors import OpperfError
from opperf.io import atomic_output
from opperf.log import get_logger
from opperf.parse.attribution import COLLECTIVES, Attribution, is_collective_kernel, is_collective_op
from opperf.parse.kernel_details import DURATION, TRACE_EVENT, TYPE, ProfileTable
from opperf.input_values import INPUT_VALUES, PROFILER_LIST_LIMIT, RecordedValues, recorded_arguments
from opperf.parse.reuse import load_nodes, reuse_distances, same_call, tensor_shapes
from opperf.power_samples import FIELDS as POWER_FIELDS
from opperf.power_samples import SYNC_RANGE as POWER_SYNC_RANGE
from opperf.power_samples import (GEMM_BEFORE, GEMM_WINDOW_US, IDLE_BEFORE, gemm_time_before, op_base_name,
                                  power_weights, samples_at)

log = get_logger("parse.torch_trace")

# Ops that move no data of their own (views, allocation, metadata, conversions of bookkeeping scalars):
# never a row of their own, and never make an op around them composite.
VIEW_AND_ALLOCATION_OPS = frozenset({
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "as_strided", "view",
    "_reshape_alias", "reshape", "t", "transpose", "permute", "expand", "expand_as", "unsqueeze", "squeeze",
    "slice", "select", "narrow", "detach", "detach_", "alias", "_unsafe_view", "lift_fresh", "resolve_conj",
    "resolve_neg", "view_as", "unflatten", "flatten", "split", "split_with_sizes", "chunk", "unbind",
    "contiguous", "result_type", "size", "stride", "numel", "dim", "is_nonzero", "item", "_local_scalar_dense",
    "set_", "resize_", "to", "type_as", "zero_", "fill_", "zeros", "ones", "full", "zeros_like", "ones_like",
    "full_like", "scalar_tensor", "_to_copy", "lift",
})
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RUNTIME_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})
TRACE_COLUMNS = ["Name", TYPE, OP_STATE, ACCELERATOR_CORE, "Start Time(us)", DURATION, INPUT_SHAPES, INPUT_DTYPES,
                 INPUT_FORMATS, OUTPUT_SHAPES, OUTPUT_DTYPES, OUTPUT_FORMATS, INPUT_SCALARS, INPUT_STRIDES]

_SCALAR_TYPES: dict[int, object] = {}

# Conversion outcomes counted in the log (not database rows).
NOT_A_ROW_VIEW = "view/allocation/metadata op"
NOT_A_ROW_SCALARS_ONLY = "no tensor operand of rank >= 1"
NOT_A_ROW_COMPOSITE = "composite op (represented by the ops inside it)"
NOT_A_ROW_NO_DEVICE_TIME = "launched no device activity"
VALUES_NOT_RECORDED = ("op calls whose values set their time but input_values.json beside the trace has none of "
                       "their op and shapes (replayed with a balanced split)")
REUSE_NOT_KNOWN = "op calls the execution trace beside the trace does not describe slot by slot (no reuse distances)"
OUTPUTS_NOT_INFERRED = "output shapes not inferable on meta tensors (left empty)"
STRINGS_FROM_EXECUTION_TRACE = "op calls whose string arguments (unrecorded by torch.profiler) came from the execution trace"
STRINGS_NOT_RECORDED = ("op calls whose string arguments no execution trace recorded (replayed with the schema's "
                        "default)")
DEVICE_TIME_WITHOUT_OP = "device activities launched outside any aten op (see the attribution lines)"
LIST_DTYPE_FROM = "TensorList member dtypes taken from "       # + the source (workload.json, kernel name, ...)
INDICES_FROM_CHILDREN = "Tensor?[] index lists rebuilt from the index tensors the op reshapes"
LIST_SHAPES_FROM_VALUES = (f"TensorLists of more than {PROFILER_LIST_LIMIT} tensors (member shapes not in the trace) "
                           f"filled from {INPUT_VALUES}")
LIST_SHAPES_NOT_RECORDED = (f"op calls with a TensorList of more than {PROFILER_LIST_LIMIT} tensors, whose member "
                            f"shapes torch.profiler does not record and no {INPUT_VALUES} beside the trace gives: rows "
                            f"without them, which replay cannot build (profile with scripts/profile_workload.py, or "
                            f"record them with opperf.workload.values.ValueRecorder)")
# Device activity that no op launched: what it was (the parse's attribution accounting).
UNATTRIBUTED_GRAPH = "kernels replayed from a CUDA graph (cudaGraphLaunch; no op records their shapes)"
UNATTRIBUTED_TRITON = "Triton kernels launched outside any op"
UNATTRIBUTED_COPY = "memcpy/memset activities outside any op"
UNATTRIBUTED_KERNEL = "kernels launched outside any op"
UNATTRIBUTED_NO_LAUNCH = "device activities with no launch record in the trace"
UNATTRIBUTED_COMPILED = ("device activities of torch.compile regions (CompiledFunction, Torch-Compiled Region: no op "
                         "records their shapes)")
UNATTRIBUTED_NOT_AN_OP = ("device activities launched directly by events that are not ops (C++/Python autograd "
                          "functions such as torch::autograd::CppNode<...>: no op records their shapes)")
UNATTRIBUTED_NO_SHAPES = "launches of ops recorded without shapes (profile with record_shapes=True)"
KERNEL_ROW_KINDS = (UNATTRIBUTED_GRAPH, UNATTRIBUTED_TRITON, UNATTRIBUTED_KERNEL, UNATTRIBUTED_COMPILED,
                    UNATTRIBUTED_NOT_AN_OP)
NOT_A_KERNEL_TYPE = " (kernel name not usable as a Type: not replayable)"
# Outcomes of op events that are not rows, and what a row lacks, that a user must act on: logged at WARNING.
NOT_A_ROW_COLLECTIVE = "collective op (measured by the comm stage, not a compute row)"
NOT_A_ROW_COMPILED = "torch.compile region (its generated kernels record no op: not replayable)"
NOT_A_ROW_NOT_AN_OP = "not an op (an autograd function or other event torch.profiler records as cpu_op)"
NOT_A_ROW_NO_SHAPES = ("op recorded without shapes (no `Input Dims`: profile with "
                       "torch.profiler.profile(record_shapes=True))")
SCALARS_NOT_RECORDED = ("op calls with non-tensor arguments whose values torch.profiler did not record (no `Concrete "
                        "Inputs`: torch <= 2.0): their rows have empty Input Scalars (a `dim`, `eps`, `alpha` "
                        "missing), outputs inferred with defaults or not at all, and may fail replay; profile with "
                        "torch >= 2.1")
WARNING_OUTCOMES = frozenset({LIST_SHAPES_NOT_RECORDED, NOT_A_ROW_NO_SHAPES, SCALARS_NOT_RECORDED})
# torch.compile's regions as torch.profiler names them (AOTAutograd's autograd.Function, Dynamo's frame).
_COMPILED_REGION = re.compile(r"CompiledFunction|Torch-Compiled Region|TorchDynamo|CompiledFxGraph")
# A dispatcher op: `namespace::name` (aten::mm, fbgemm::permute_2D_sparse_data, vllm::unified_attention).
_DISPATCHER_OP = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.\w+)?$")
# Ops whose `Tensor?[] indices` torch.profiler records as one empty slot.
INDEX_LIST_OPS = frozenset({"aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put",
                            "aten::_unsafe_index", "aten::_unsafe_index_put"})
INDEX_LIST = "IndexList"              # our marker in a copied args dict: the rebuilt `Tensor?[]` of an index op
INDEX_LIST_TYPES = "Index List Types"
_INTEGER_TYPES = frozenset({"long int", "int", "short int", "signed char", "unsigned char", "bool", "long"})


@dataclass
class _Op:
    index: int              # position in traceEvents (how a row is located)
    name: str
    ts: float
    dur: float
    thread: tuple
    args: dict
    parent: int | None = None
    device_us: float = 0.0
    device_activities: int = 0
    device_span: tuple[float, float] | None = None     # first kernel start, last kernel end (trace µs)
    kernel_names: list[str] = field(default_factory=list)
    children: list[int] = field(default_factory=list)     # positions of the ops directly inside it


@dataclass
class TraceConversion:
    rows: list[dict[str, str]] = field(default_factory=list)
    events: list[int] = field(default_factory=list)        # traceEvents index of each row
    outcomes: Counter = field(default_factory=Counter)
    accelerator_core: str = "CPU"
    attribution: Attribution = field(default_factory=Attribution)
    power_fields: tuple[str, ...] = ()        # per-call power-state values the rows carry (power_samples.json,
                                              # and the GEMM history before each call)
    reuse_known: int = 0                      # calls the execution trace gave input reuse distances for
    values_known: int = 0                     # calls input_values.json gave recorded values for


def kernel_type_of(op_name: str) -> str:
    """`aten::mm` → `mm`; `ns::op` → `ns.op`."""
    namespace, _, name = op_name.partition("::")
    if not name:
        return op_name
    return name if namespace == "aten" else f"{namespace}.{name}"


def _load_events(path: Path) -> tuple[list[dict], dict]:
    """The trace's events and its other top-level fields (deviceProperties, distributedInfo, ...)."""
    opener = gzip.open if path.name.endswith(".gz") else open     # tensorboard_trace_handler(use_gzip=True)
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            document = json.load(handle)
    except UnicodeDecodeError as exc:
        raise OpperfError(f"not UTF-8 text ({exc.reason})", path=path) from exc
    except (OSError, EOFError) as exc:       # a corrupt or truncated .gz
        raise OpperfError(f"cannot read: {exc}", path=path) from exc
    except json.JSONDecodeError as exc:
        raise OpperfError(f"not valid JSON: {exc.msg} (column {exc.colno})", path=path, row=exc.lineno) from exc
    events = document.get("traceEvents") if isinstance(document, dict) else document
    if not isinstance(events, list):
        raise OpperfError("no traceEvents list: not a torch.profiler Chrome trace", path=path, field="traceEvents")
    return events, (document if isinstance(document, dict) else {})


def _device_core(events: list, document: dict) -> str:
    """The Accelerator Core of a trace with device activity: `ROCM` for an AMD GPU (HIP runtime calls, roctracer,
    an AMD device or a gcnArchName in deviceProperties), else `CUDA`. torch.profiler files a HIP launch under the
    `cuda_runtime` category and a ROCm build answers to torch.cuda, so only these say which it was."""
    for device in document.get("deviceProperties") or []:
        if isinstance(device, dict) and ("gcnArchName" in device or str(device.get("name", "")).startswith("AMD")):
            return "ROCM"
    for event in events:
        if isinstance(event, dict) and event.get("cat") in RUNTIME_CATEGORIES:
            name = str(event.get("name", ""))
            if name.startswith("hip") or "roctracer" in name:
                return "ROCM"
            if name.startswith("cu"):
                return "CUDA"
    return "CUDA"


def _is_tensor_arg(dims, type_name: str) -> bool:
    return type_name in PROFILER_TYPE_TO_TORCH or (isinstance(dims, list) and len(dims) > 0
                                                   and type_name not in ("TensorList", "ScalarList", "GenericList"))


def _profiler_dtype(type_name: str) -> str:
    torch_name = PROFILER_TYPE_TO_TORCH.get(type_name)
    return TORCH_TO_PROFILER_DTYPE.get(torch_name, type_name) if torch_name else type_name


@dataclass
class _Slots:
    shapes: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    dims: list[list[int] | None] = field(default_factory=list)        # per slot, for the strides field
    strides: list[list[int] | None] = field(default_factory=list)
    has_tensor: bool = False

    def strides_field(self) -> str:
        return strides_text(self.dims, self.strides)


def input_shapes_field(args: dict) -> str:
    """The Input Shapes field the parse writes for an op event's args (a TensorList's members are slots of their
    own), so that a tool can find a row's calls in the trace."""
    return ";".join(_input_slots(args).shapes)


def _input_slots(args: dict, list_dtype: str = "") -> _Slots:
    dims_list = args.get("Input Dims") or []
    types = args.get("Input type") or []
    concrete = args.get("Concrete Inputs") or []
    strides_list = args.get("Input Strides") or []
    slots = _Slots()
    for i, dims in enumerate(dims_list):
        type_name = types[i] if i < len(types) else ""
        value = concrete[i] if i < len(concrete) else ""
        strides = strides_list[i] if i < len(strides_list) else None
        if type_name == INDEX_LIST and isinstance(dims, list):
            member_types = args.get(INDEX_LIST_TYPES) or []
            for member, member_type in zip(dims, member_types):   # rebuilt from the op's children (_index_lists)
                slots.shapes.append(",".join(str(int(d)) for d in member))
                slots.dtypes.append(_profiler_dtype(member_type))
                slots.formats.append("ND")
                slots.scalars.append("")
                slots.dims.append([int(d) for d in member])
                slots.strides.append(None)
        elif type_name == "TensorList" and isinstance(dims, list) and all(isinstance(d, list) for d in dims):
            slots.has_tensor |= not dims      # members not recorded (a list longer than the profiler keeps)
            member_strides = strides if isinstance(strides, list) and len(strides) == len(dims) else [None] * len(dims)
            for member, member_stride in zip(dims, member_strides):   # one slot per tensor (no member dtypes recorded)
                slots.shapes.append(",".join(str(int(d)) for d in member))
                slots.dtypes.append(list_dtype)
                slots.formats.append("ND")
                slots.scalars.append("")
                slots.dims.append([int(d) for d in member])
                slots.strides.append(_int_list(member_stride))
                slots.has_tensor |= len(member) > 0
        elif _is_tensor_arg(dims, type_name):
            slots.shapes.append(",".join(str(int(d)) for d in dims))
            slots.dtypes.append(_profiler_dtype(type_name))
            slots.formats.append("ND")
            slots.scalars.append("")
            slots.dims.append([int(d) for d in dims])
            slots.strides.append(_int_list(strides))
            slots.has_tensor |= len(dims) > 0
        else:
            slots.shapes.append("")
            slots.dtypes.append("")
            slots.formats.append("")
            slots.scalars.append(str(value).replace(";", ","))
            slots.dims.append(None)
            slots.strides.append(None)
    return slots


def _int_list(value) -> list[int] | None:
    """A recorded stride list, or None when the trace has none (older torch) or it is not a flat int list."""
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return value


def _parse_scalar(text: str, type_name: str):
    if text == "" and type_name == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        try:
            return float(text)
        except ValueError:
            return text


class _MetaShapes:
    """Output shapes/dtypes of an aten op from its recorded inputs, by running it on meta tensors."""

    def __init__(self):
        import torch   # only traces need torch; kernel_details parsing never imports it

        self.list_dtype = ""                 # profiler dtype of the current op's TensorList members, '' when unknown
        self.torch = torch
        self.cache: dict = {}
        self.strings: dict[tuple, tuple[int, ...]] = {}
        global _SCALAR_TYPES
        _SCALAR_TYPES = _SCALAR_TYPES or _scalar_types()

    def outputs(self, op_name: str, args: dict, list_dtype: str = "") -> tuple[str, str, str] | None:
        key = (op_name, list_dtype, json.dumps([args.get("Input Dims"), args.get("Input type"),
                                                args.get("Concrete Inputs"), args.get(INDEX_LIST_TYPES)]))
        if key not in self.cache:
            self.list_dtype = list_dtype
            self.cache[key] = self._infer(op_name, args)
        return self.cache[key]

    def string_positions(self, op_name: str, types: list) -> tuple[int, ...]:
        """The argument positions an overload of the op that fits the recorded argument types (as many arguments,
        tensors where the trace has tensors, nothing recorded where it has strings) types `str` (or `str?`)."""
        key = (op_name, tuple(types))
        if key not in self.strings:
            packet = self._packet(op_name)
            schemas = [getattr(packet, overload)._schema for overload in packet.overloads()] if packet else []
            positions = set()
            for schema in schemas:
                kinds = [str(argument.type) for argument in schema.arguments]
                strings = [i for i, kind in enumerate(kinds) if kind in ("str", "str?", "Optional[str]")]
                if strings and len(kinds) == len(types) and all(
                        types[i] == "" for i in strings) and all(
                        "Tensor" in kind for kind, recorded in zip(kinds, types) if recorded in PROFILER_TYPE_TO_TORCH):
                    positions.update(strings)
            self.strings[key] = tuple(sorted(positions))
        return self.strings[key]

    def _packet(self, op_name: str):
        """torch.ops.<ns>.<op> of a trace's `ns::op`, None when torch has no such op here."""
        namespace, _, name = op_name.partition("::")
        try:
            return getattr(getattr(self.torch.ops, namespace), name)
        except (AttributeError, RuntimeError):
            return None

    def _infer(self, op_name: str, args: dict):
        torch = self.torch
        packet = self._packet(op_name)
        if packet is None:
            return None
        values, dtype_known = self._arguments(args)
        if values is None:
            return None
        result = self._call_matching_overload(packet, values)
        if result is None:
            return None
        outputs = result if isinstance(result, (tuple, list)) else (result,)
        shapes, dtypes, formats = [], [], []
        for output in outputs:
            if isinstance(output, torch.Tensor):
                shapes.append(",".join(str(d) for d in output.shape))
                dtype = str(output.dtype).removeprefix("torch.")
                dtypes.append(TORCH_TO_PROFILER_DTYPE.get(dtype, dtype) if dtype_known else "")
                formats.append("ND")
            else:
                shapes.append("")
                dtypes.append("")
                formats.append("")
        return ";".join(shapes), ";".join(dtypes), ";".join(formats)

    def _arguments(self, args: dict):
        """The recorded arguments as Python values with meta tensors; (None, _) if a tensor cannot be built."""
        torch = self.torch
        values, dtype_known = [], True
        dims_list = args.get("Input Dims") or []
        types = args.get("Input type") or []
        concrete = args.get("Concrete Inputs") or []
        for i, dims in enumerate(dims_list):
            type_name = types[i] if i < len(types) else ""
            text = concrete[i] if i < len(concrete) else ""
            if type_name in PROFILER_TYPE_TO_TORCH:
                dtype = getattr(torch, PROFILER_TYPE_TO_TORCH[type_name])
                values.append(torch.empty([int(d) for d in dims], dtype=dtype, device="meta"))
            elif type_name == INDEX_LIST:
                member_types = args.get(INDEX_LIST_TYPES) or []
                values.append([torch.empty([int(d) for d in member], device="meta",
                                           dtype=getattr(torch, PROFILER_TYPE_TO_TORCH.get(t, "int64")))
                               for member, t in zip(dims, member_types)])
            elif type_name == "TensorList" and all(isinstance(d, list) for d in dims):
                # Member dtypes are not recorded: shapes can still be inferred; dtypes only from the workload's.
                member_dtype = _torch_dtype_of(torch, self.list_dtype)
                dtype_known = dtype_known and member_dtype is not None
                values.append([torch.empty([int(d) for d in member], dtype=member_dtype or torch.float32,
                                           device="meta") for member in dims])
            elif _is_tensor_arg(dims, type_name):
                return None, False
            else:
                values.append(_parse_scalar(str(text), type_name))
        return values, dtype_known

    def _call_matching_overload(self, packet, values: list):
        """Bind the positionally recorded values (the profiler records keyword-only ones too) to each overload
        with that many arguments; the first that runs gives the outputs."""
        torch = self.torch
        for overload in packet.overloads():
            op = getattr(packet, overload)
            arguments = op._schema.arguments
            if len(arguments) != len(values):
                continue
            bound = []
            for argument, value in zip(arguments, values):
                type_text = str(argument.type)
                if "ScalarType" in type_text and isinstance(value, int) and not isinstance(value, bool):
                    value = _SCALAR_TYPES.get(value)
                elif any(t in type_text for t in ("Layout", "Device", "MemoryFormat", "Generator")):
                    value = None
                elif value is None and argument.has_default_value() and "Optional" not in type_text and "?" not in type_text:
                    value = argument.default_value      # not recorded (a string): the schema's default
                bound.append(value)
            positional = [v for a, v in zip(arguments, bound) if not a.kwarg_only]
            keywords = {a.name: v for a, v in zip(arguments, bound) if a.kwarg_only}
            try:
                with torch.no_grad():
                    return op(*positional, **keywords)
            except Exception:   # noqa: BLE001 — not this overload (or no meta kernel): try the next
                continue
        return None


def _torch_dtype_of(torch, profiler_dtype: str):
    """`DT_BF16` → torch.bfloat16 (None for '' or a name torch does not have)."""
    for torch_name, profiler_name in TORCH_TO_PROFILER_DTYPE.items():
        if profiler_name == profiler_dtype and hasattr(torch, torch_name):
            return getattr(torch, torch_name)
    return None


def workload_list_dtype(trace_path: Path) -> str:
    """The activation dtype the reference workload recorded beside its trace (workload.json), as a profiler
    dtype name; '' for any other trace."""
    manifest = trace_path.parent / WORKLOAD_MANIFEST
    if not manifest.exists():
        return ""
    try:
        dtype = str(json.loads(manifest.read_text(encoding="utf-8")).get("dtype", ""))
    except (OSError, ValueError, AttributeError) as exc:
        raise OpperfError(f"cannot read the workload manifest: {exc}", path=manifest, field="dtype") from exc
    if dtype and dtype not in TORCH_TO_PROFILER_DTYPE:
        raise OpperfError(f"unknown dtype {dtype!r}", path=manifest, field="dtype")
    return TORCH_TO_PROFILER_DTYPE.get(dtype, "")


def _scalar_types() -> dict[int, object]:
    import torch

    return {code: getattr(torch, name) for code, name in SCALAR_TYPE_NAMES.items() if hasattr(torch, name)}


def _nest(ops: list[_Op], markers: list[tuple[int, float, tuple]]) -> dict[int, int]:
    """Set each op's parent (innermost enclosing op on its thread); return marker → innermost enclosing op."""
    by_thread: dict[tuple, list] = {}
    for position, op in enumerate(ops):
        by_thread.setdefault(op.thread, []).append((op.ts, 0, -op.dur, position))
    for marker_id, ts, thread in markers:
        by_thread.setdefault(thread, []).append((ts, 1, 0.0, marker_id))
    enclosing: dict[int, int] = {}
    for items in by_thread.values():
        items.sort()
        stack: list[int] = []
        for ts, kind, _, ident in items:
            while stack and ops[stack[-1]].ts + ops[stack[-1]].dur < ts:
                stack.pop()
            if kind == 0:
                ops[ident].parent = stack[-1] if stack else None
                stack.append(ident)
            elif stack:
                enclosing[ident] = stack[-1]
    return enclosing


def convert_trace(path: str | Path, *, input_reuse: bool = True) -> TraceConversion:
    """Convert a Chrome trace's events into kernel_details-like rows (see module docstring). Without `input_reuse`
    the execution trace beside it is not read and no row gets reuse distances (stage 4b, which only orders the
    calls: 49-53 s with it, 23-25 s without, for a 117 MB CPU trace)."""
    path = Path(path)
    events, document = _load_events(path)
    ops: list[_Op] = []
    runtime_calls: list[tuple[int, float, tuple]] = []
    runtime_names: dict[object, str] = {}
    device_activities: dict[object, list[tuple[float, str, str, int]]] = {}   # correlation -> (dur, name, cat, ev)
    unlaunched: list[tuple[float, str, str, int]] = []
    sync_ts: float | None = None             # where the power sampler's sync range starts (opperf.workload.power)
    for index, event in enumerate(events):
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        category = event.get("cat", "")
        args = event.get("args") or {}
        try:
            ts, dur = float(event["ts"]), float(event.get("dur", 0))
        except (KeyError, TypeError, ValueError) as exc:
            raise OpperfError(f"event {index} ({event.get('name')!r}) has no numeric ts/dur", path=path,
                              field="ts") from exc
        thread = (event.get("pid"), event.get("tid"))
        if event.get("name") == POWER_SYNC_RANGE and sync_ts is None:
            sync_ts = ts
        if category == "cpu_op":
            ops.append(_Op(index=index, name=str(event.get("name", "")), ts=ts, dur=dur, thread=thread, args=args))
        elif category in RUNTIME_CATEGORIES and "correlation" in args:
            runtime_calls.append((args["correlation"], ts, thread))
            runtime_names[args["correlation"]] = str(event.get("name", ""))
        elif category in DEVICE_CATEGORIES:
            activity = (dur, str(event.get("name", "")), category, index)
            if "correlation" in args:
                device_activities.setdefault(args["correlation"], []).append(activity)
            else:
                unlaunched.append(activity)
    launcher = _nest(ops, runtime_calls)
    for position, op in enumerate(ops):
        if op.parent is not None:
            ops[op.parent].children.append(position)
    if ops and not any("Input Dims" in op.args for op in ops):
        raise OpperfError(f"recorded without shapes: none of its {len(ops)} op events has `Input Dims`, so no row "
                          "could say what its op computed (every call of an op would be one row with a mixed mean); "
                          "profile with torch.profiler.profile(record_shapes=True)", path=path, field="Input Dims")
    conversion = TraceConversion(accelerator_core=(_device_core(events, document) if device_activities or unlaunched
                                                   else "CPU"))
    kernel_rows: list[tuple[str, str, float, int, float]] = []       # (Type, OP State, µs, event, ts)
    if conversion.accelerator_core != "CPU":
        attribution = conversion.attribution
        excluded: dict[int, str] = {}          # op position -> why its own launches are no row
        for correlation, activities in device_activities.items():
            op_position = launcher.get(correlation)
            exclusion = None
            if op_position is not None:
                exclusion = excluded.get(op_position)
                if exclusion is None and op_position not in excluded:
                    exclusion = excluded[op_position] = op_exclusion(ops[op_position].name, ops[op_position].args)
            runtime_name = runtime_names.get(correlation)
            for duration, name, category, event_index in activities:
                attribution.device_us += duration
                if op_position is not None and exclusion is None and not is_collective_kernel(name):
                    op = ops[op_position]
                    op.device_us += duration
                    op.device_activities += 1
                    op.kernel_names.append(name)
                    start = float(events[event_index]["ts"])
                    op.device_span = ((start, start + duration) if op.device_span is None else
                                      (min(op.device_span[0], start), max(op.device_span[1], start + duration)))
                    continue
                conversion.outcomes[DEVICE_TIME_WITHOUT_OP] += 1
                kind = _unattributed_kind(runtime_name, name, category)
                if exclusion is not None and kind != COLLECTIVES:
                    kind = _EXCLUDED_LAUNCHES[exclusion]
                own_row = kind in KERNEL_ROW_KINDS and category == "kernel"
                if own_row and not kernel_type_problem(name):
                    # A kernel no op records (graph replay, Triton, a compiled region's): a row by its name.
                    graph = runtime_name is not None and "GraphLaunch" in runtime_name
                    state = "graph" if graph else "compiled" if kind == UNATTRIBUTED_COMPILED else "eager"
                    kernel_rows.append((name, state, duration, event_index, float(events[event_index]["ts"])))
                else:
                    attribution.add(kind + (NOT_A_KERNEL_TYPE if own_row else ""), duration)
        for duration, name, category, _ in unlaunched:
            attribution.device_us += duration
            attribution.add(COLLECTIVES if is_collective_kernel(name) else UNATTRIBUTED_NO_LAUNCH, duration)
            conversion.outcomes[DEVICE_TIME_WITHOUT_OP] += 1
        for exclusion in excluded.values():
            if exclusion is not None:
                conversion.outcomes[exclusion] += 1
        chosen = []
        for op in ops:
            if op.device_activities:
                chosen.append((op, op.device_us))
            else:
                conversion.outcomes[NOT_A_ROW_NO_DEVICE_TIME] += 1
        attribution.rows_us = sum(d for _, d in chosen) + sum(row[2] for row in kernel_rows)
    else:
        chosen = _innermost_compute_ops(ops, conversion.outcomes)
    device = conversion.accelerator_core != "CPU"
    unrecorded = sum(1 for op, _ in chosen if "Concrete Inputs" not in op.args
                     and any(dims is None for dims in _input_slots(op.args).dims))
    if unrecorded:
        conversion.outcomes[SCALARS_NOT_RECORDED] = unrecorded
    power = samples_at(path, sync_ts) if device else None
    workload_dtype = workload_list_dtype(path)
    dominant = _trace_dtypes(ops) if chosen else Counter()
    meta = _MetaShapes() if chosen else None
    strings = _string_arguments(meta, chosen) if chosen else {}
    nodes = _execution_trace(path, chosen, conversion) if chosen and (input_reuse or strings) else None
    reuse = _input_reuse(nodes, chosen, conversion) if nodes is not None and input_reuse else {}
    gemm_before = _gemm_time_before(chosen) if device else {}
    idle_before = _idle_before(chosen, events, device_activities, unlaunched) if device else {}
    values = RecordedValues.beside(path) if chosen else None
    if chosen:
        conversion.power_fields = (*(power.fields if power is not None else ()),
                                   *((GEMM_BEFORE,) if gemm_before else ()), *((IDLE_BEFORE,) if idle_before else ()))
    for op, duration_us in chosen:
        base_name = op_base_name(op.name)
        args = _with_index_lists(op, ops, conversion.outcomes)
        if op.index in strings:
            args = _with_strings(args, strings[op.index], nodes, conversion.outcomes)
        args, list_dtype = _with_list_members(args, base_name, values, conversion.outcomes)
        list_dtype = list_dtype or _list_member_dtype(op, ops, args, workload_dtype, dominant, conversion.outcomes)
        row = op_call_row(op.name, args, conversion.accelerator_core, list_dtype, meta)
        if not row[OUTPUT_SHAPES] and not row[OUTPUT_DTYPES]:
            conversion.outcomes[OUTPUTS_NOT_INFERRED] += 1
        distances = reuse.get(op.index)
        if distances is not None and distances.count(";") == row[INPUT_SHAPES].count(";"):
            row[PROFILING_INPUT_REUSE] = distances
        elif reuse:
            conversion.outcomes[REUSE_NOT_KNOWN] += 1
        if power is not None:
            state = power.at(*op.device_span) if op.device_span else None
            row.update(zip(power.fields, state) if state else ())
        if op.index in gemm_before:
            row[GEMM_BEFORE] = gemm_before[op.index]
        if op.index in idle_before:
            row[IDLE_BEFORE] = idle_before[op.index]
        if values is not None and recorded_arguments(base_name) and row[INPUT_SHAPES]:
            cell = values.next_call(base_name, op.args.get("Input Dims") or [], row[INPUT_SHAPES].count(";") + 1)
            if cell is None:
                conversion.outcomes[VALUES_NOT_RECORDED] += 1
            else:
                row[PROFILING_INPUT_VALUES] = cell
                conversion.values_known += 1
        conversion.rows.append({"Name": op.name, TYPE: kernel_type_of(op.name), OP_STATE: "eager",
                                ACCELERATOR_CORE: conversion.accelerator_core, "Start Time(us)": repr(op.ts),
                                DURATION: repr(duration_us), **row})
        conversion.events.append(op.index)
    for kernel_type, state, duration_us, event_index, ts in kernel_rows:
        # A kernel no op launched (graph replay, Triton from Python): a row of its own by name, no shapes known.
        conversion.rows.append({
            "Name": kernel_type, TYPE: kernel_type, OP_STATE: state, ACCELERATOR_CORE: conversion.accelerator_core,
            "Start Time(us)": repr(ts), DURATION: repr(duration_us), INPUT_SHAPES: "", INPUT_DTYPES: "",
            INPUT_FORMATS: "", OUTPUT_SHAPES: "", OUTPUT_DTYPES: "", OUTPUT_FORMATS: "", INPUT_SCALARS: "",
            INPUT_STRIDES: ""})
        conversion.events.append(event_index)
    return conversion


def _gemm_time_before(chosen: list[tuple[_Op, float]]) -> dict[int, float]:
    """Per chosen op with device time (by event index), the equivalent GEMM length of the GEMM/attention history
    before its first kernel (opperf.power_samples.gemm_time_before): the state the workload ran it in."""
    spanned = [op for op, _ in chosen if op.device_span]
    weights = power_weights([(op.name, op.args.get("Input Dims"), op.device_span[1] - op.device_span[0])
                             for op in spanned])
    values = gemm_time_before([(*op.device_span, weight) for op, weight in zip(spanned, weights)])
    return {op.index: value for op, value in zip(spanned, values)}


def _idle_before(chosen: list[tuple[_Op, float]], events: list, device_activities: dict,
                 unlaunched: list) -> dict[int, float]:
    """Per chosen op with device time (by event index), how long no device activity of any stream had been running
    when its first one started (µs; 0 when another stream's was still running); the trace's first call gets none."""
    intervals = sorted((float(events[index]["ts"]), float(events[index]["ts"]) + duration)
                       for activities in (*device_activities.values(), unlaunched)
                       for duration, _, _, index in activities)
    starts = [start for start, _ in intervals]
    latest_end, running = [], -math.inf        # latest_end[i]: the latest end among intervals[:i + 1]
    for _, end in intervals:
        running = max(running, end)
        latest_end.append(running)
    idle = {}
    for op, _ in chosen:
        if op.device_span is None:
            continue
        before = bisect.bisect_left(starts, op.device_span[0])
        if before:
            idle[op.index] = round(max(0.0, op.device_span[0] - latest_end[before - 1]), 3)   # trace: ns
    return idle


def _string_arguments(meta: _MetaShapes, chosen: list[tuple[_Op, float]]) -> dict[int, list[int]]:
    """Event index → the argument positions of each chosen call that its op's schema types `str` and the trace left
    empty: torch.profiler records no string (gelu's `approximate`, div's `rounding_mode`), the execution trace
    does."""
    found = {}
    for op, _ in chosen:
        concrete, types = op.args.get("Concrete Inputs") or [], op.args.get("Input type") or []
        positions = meta.string_positions(op.name, types)
        empty = [i for i in positions if i < len(concrete) and concrete[i] == ""]
        if empty:
            found[op.index] = empty
    return found


def _with_strings(args: dict, positions: list[int], nodes: dict[int, dict] | None, outcomes: Counter) -> dict:
    """The call's arguments with the strings the execution trace recorded at `positions` (a copy); as they were,
    counted, when there is no execution trace or it has no string there (the row then replays the schema's
    default)."""
    node = (nodes or {}).get(args.get("Record function id"))
    recorded = (node or {}).get("inputs", {})
    values, types = recorded.get("values") or [], recorded.get("types") or []
    concrete = list(args.get("Concrete Inputs") or [])
    filled = False
    for i in positions:
        if i < len(values) and i < len(types) and types[i] == "String" and isinstance(values[i], str):
            concrete[i], filled = values[i], True
    if not filled:
        outcomes[STRINGS_NOT_RECORDED] += 1
        return args
    outcomes[STRINGS_FROM_EXECUTION_TRACE] += 1
    return {**args, "Concrete Inputs": concrete}


def _execution_trace(path: Path, chosen: list[tuple[_Op, float]], conversion: TraceConversion) -> dict | None:
    """The execution trace beside the trace (opperf.parse.reuse.load_nodes), checked to be of the same run: every
    chosen call it describes has the same op and tensor shapes, and it describes at least half of them. None when
    the trace was recorded without one."""
    et_path = path.parent / EXECUTION_TRACE
    if not et_path.exists():
        return None
    nodes = load_nodes(et_path)
    calls = [(op, op.args.get("Record function id")) for op, _ in chosen]
    reshaped = 0
    for op, rf_id in calls:
        node = nodes.get(rf_id)
        if node is not None and node.get("name") == op.name and not same_call(node, op.name,
                                                                             op.args.get("Input Dims") or []):
            reshaped += 1          # the same op recorded in a pass of its own whose MoE split moved (workload.execution_trace)
        elif node is not None and node.get("name") != op.name:
            raise OpperfError(f"record function {rf_id} is {node.get('name')!r} with tensor shapes "
                              f"{tensor_shapes(node)} in the execution trace but {op.name!r} with "
                              f"{op.args.get('Input Dims')} at trace event {op.index} of {path.name}: the execution "
                              "trace is of another run (remove it, or record both in one profiler session)",
                              path=et_path, field="rf_id")
    if reshaped:
        log.warning("%s: %d calls have other tensor shapes in the execution trace (recorded in a pass of its own): "
                    "their reuse distances come from that pass's storages", et_path, reshaped)
    if reshaped > len(calls) / 2:
        raise OpperfError(f"{reshaped} of the trace's {len(calls)} op calls have other tensor shapes in the execution "
                          "trace: it is of another run (remove it, or record both in one profiler session)",
                          path=et_path, field="rf_id")
    described = sum(rf_id in nodes for _, rf_id in calls)
    if described < len(calls) / 2:
        raise OpperfError(f"the execution trace describes {described} of the trace's {len(calls)} op calls that "
                          f"became rows: it is of another run (remove it, or record both in one profiler session)",
                          path=et_path, field="rf_id")
    return nodes


def _input_reuse(nodes: dict[int, dict], chosen: list[tuple[_Op, float]],
                 conversion: TraceConversion) -> dict[int, str]:
    """Event index → Input Reuse Distance field of each chosen call, from the execution trace (opperf.parse.reuse)."""
    device = conversion.accelerator_core != "CPU"
    ordered = sorted((op for op, _ in chosen),
                     key=lambda op: op.device_span[0] if device and op.device_span else op.ts)
    calls = [op.args.get("Record function id") for op in ordered]
    fields = reuse_distances(nodes, calls, "cuda" if device else "")
    conversion.reuse_known = sum(f is not None for f in fields)
    return {op.index: f for op, f in zip(ordered, fields) if f is not None}


def op_call_row(op_name: str, args: dict, accelerator_core: str, list_dtype: str = "",
                meta: _MetaShapes | None = None) -> dict[str, str]:
    """The row fields of one op call from its arguments as torch.profiler records them (`Input Dims`, `Input
    type`, `Concrete Inputs`, `Input Strides`): input slots, and output slots inferred on meta tensors (empty
    when no overload runs on meta). A profiled call and a call recorded any other way (a performance model's
    query, opperf.consumer.queries) become rows of the same layout through this one function."""
    slots = _input_slots(args, list_dtype)
    inferred = (meta or _MetaShapes()).outputs(op_name, args, list_dtype) or ("", "", "")
    return {INPUT_SHAPES: ";".join(slots.shapes), INPUT_DTYPES: ";".join(slots.dtypes),
            INPUT_FORMATS: ";".join(slots.formats), OUTPUT_SHAPES: inferred[0], OUTPUT_DTYPES: inferred[1],
            OUTPUT_FORMATS: inferred[2], INPUT_SCALARS: ";".join(slots.scalars), INPUT_STRIDES: slots.strides_field()}


def op_exclusion(name: str, args: dict) -> str | None:
    """Why an op event is no row of its own (a NOT_A_ROW_* outcome), None for an op that is: a dispatcher op
    (`aten::mm`, `fbgemm::…`) with recorded shapes, or Inductor's record of one generated kernel's launch (it
    carries `kernel_backend` and the kernel's arguments)."""
    if is_collective_op(name):
        return NOT_A_ROW_COLLECTIVE
    if _COMPILED_REGION.search(name):
        return NOT_A_ROW_COMPILED
    if not (_DISPATCHER_OP.match(name) or "kernel_backend" in args):
        return NOT_A_ROW_NOT_AN_OP
    if "Input Dims" not in args:
        return NOT_A_ROW_NO_SHAPES
    return None


# What the device activities an excluded op launched itself are, in the attribution.
_EXCLUDED_LAUNCHES = {NOT_A_ROW_COLLECTIVE: COLLECTIVES, NOT_A_ROW_COMPILED: UNATTRIBUTED_COMPILED,
                      NOT_A_ROW_NOT_AN_OP: UNATTRIBUTED_NOT_AN_OP, NOT_A_ROW_NO_SHAPES: UNATTRIBUTED_NO_SHAPES}


def _unattributed_kind(runtime_name: str | None, kernel_name: str, category: str) -> str:
    """What a device activity no op launched was, from its launch call and its own name."""
    if is_collective_kernel(kernel_name):
        return COLLECTIVES
    if runtime_name is None:
        return UNATTRIBUTED_NO_LAUNCH
    if "GraphLaunch" in runtime_name:
        return UNATTRIBUTED_GRAPH
    if category != "kernel":
        return UNATTRIBUTED_COPY
    if kernel_name.startswith("triton"):
        return UNATTRIBUTED_TRITON
    return UNATTRIBUTED_KERNEL


def _with_list_members(args: dict, op: str, values: RecordedValues | None, outcomes: Counter) -> tuple[dict, str]:
    """The op's args with each TensorList torch.profiler left empty (more than PROFILER_LIST_LIMIT tensors: a MoE
    layer's cat of its experts' outputs) filled from input_values.json's record of the call, and the members'
    dtype; else the args as they are ('' dtype), counted: such a row has no shapes, and replay cannot build it."""
    dims_list = args.get("Input Dims") or []
    types = args.get("Input type") or []
    empty = [i for i, (kind, dims) in enumerate(zip(types, dims_list)) if kind == "TensorList" and dims == []]
    if not empty:
        return args, ""
    recorded = values.next_lists(op, dims_list) if values is not None else None
    if not recorded or any(i not in recorded for i in empty):
        outcomes[LIST_SHAPES_NOT_RECORDED] += 1
        return args, ""
    strides = list(args.get("Input Strides") or [])
    strides += [[]] * (len(dims_list) - len(strides))
    dims = list(dims_list)
    for i in empty:
        dims[i], strides[i] = recorded[i]["shapes"], recorded[i]["strides"]
    outcomes[LIST_SHAPES_FROM_VALUES] += 1
    outcomes[LIST_DTYPE_FROM + INPUT_VALUES] += 1
    return {**args, "Input Dims": dims, "Input Strides": strides}, TORCH_TO_PROFILER_DTYPE.get(
        recorded[empty[0]]["dtype"], "")


def _with_index_lists(op: _Op, ops: list[_Op], outcomes: Counter) -> dict:
    """The op's args, with an unrecorded `Tensor?[] indices` (index, index_put_) rebuilt from the integer/bool
    tensors the op reshapes inside itself (TensorIterator reshapes each index tensor once): one slot each."""
    args = op.args
    dims_list = args.get("Input Dims") or []
    types = args.get("Input type") or []
    if op.name not in INDEX_LIST_OPS or len(dims_list) < 2 or (types[1] if len(types) > 1 else "") != "" \
            or dims_list[1] not in ([], None):
        return args
    members, member_types = [], []
    for position in op.children:
        child = ops[position]
        child_dims = child.args.get("Input Dims") or []
        child_types = child.args.get("Input type") or []
        if kernel_type_of(child.name) in ("reshape", "view", "nonzero") and child_types \
                and child_types[0] in _INTEGER_TYPES and isinstance(child_dims[0], list):
            if kernel_type_of(child.name) == "view" and members and child_dims[0] == members[-1]:
                continue                  # reshape → view of the same index tensor
            members.append(child_dims[0])
            member_types.append(child_types[0])
    if not members:
        return args
    outcomes[INDICES_FROM_CHILDREN] += 1
    copied = dict(args)
    copied["Input Dims"] = [*dims_list[:1], members, *dims_list[2:]]
    copied["Input type"] = [*types[:1], INDEX_LIST, *types[2:]]
    copied[INDEX_LIST_TYPES] = member_types
    return copied


_KERNEL_DTYPES = (("c10::BFloat16", "DT_BF16"), ("__nv_bfloat16", "DT_BF16"), ("c10::Half", "DT_FLOAT16"),
                  ("__half", "DT_FLOAT16"))
_OPAQUE_SIZE = re.compile(r"OpaqueType<(\d+)u?>")


def _trace_dtypes(ops: list[_Op]) -> Counter:
    """How often each floating dtype appears among the trace's recorded tensor arguments."""
    counts: Counter = Counter()
    for op in ops:
        for type_name in op.args.get("Input type") or []:
            torch_name = PROFILER_TYPE_TO_TORCH.get(type_name, "")
            if torch_name.startswith(("float", "bfloat")):
                counts[TORCH_TO_PROFILER_DTYPE[torch_name]] += 1
    return counts


def _list_member_dtype(op: _Op, ops: list[_Op], args: dict, workload_dtype: str, dominant: Counter,
                       outcomes: Counter) -> str:
    """The dtype of a TensorList's members, which torch.profiler does not record: workload.json's; else a tensor
    of the op's child ops (CPU cat narrows its output, a copy fallback copies the members); else the element
    type in the launched kernel's name (`OpaqueType<2u>`: the trace's most common 2-byte float dtype); else the
    trace's most common floating dtype. '' for an op without a TensorList."""
    if "TensorList" not in (args.get("Input type") or []):
        return ""
    found, source = "", ""
    if workload_dtype:
        found, source = workload_dtype, "workload.json"
    for position in op.children if not found else ():
        child_types = ops[position].args.get("Input type") or []
        floating = [t for t in child_types if PROFILER_TYPE_TO_TORCH.get(t, "").startswith(("float", "bfloat"))]
        if floating:
            found, source = _profiler_dtype(floating[0]), "the op's child ops"
            break
    for name in op.kernel_names if not found else ():
        found = _kernel_name_dtype(name, dominant)
        if found:
            source = "the launched kernel's name"
            break
    if not found and dominant:
        found, source = dominant.most_common(1)[0][0], "the trace's most common floating dtype"
    if found:
        outcomes[LIST_DTYPE_FROM + source] += 1
    return found


def _kernel_name_dtype(name: str, dominant: Counter) -> str:
    for token, dtype in _KERNEL_DTYPES:
        if token in name:
            return dtype
    match = _OPAQUE_SIZE.search(name)
    if not match:
        return ""
    size = int(match.group(1))
    for dtype, _ in dominant.most_common():
        if dtype_bytes(dtype) == size:
            return dtype
    return {4: "DT_FLOAT", 8: "DT_DOUBLE"}.get(size, "")


def _innermost_compute_ops(ops: list[_Op], outcomes: Counter) -> list[tuple[_Op, float]]:
    compute = []
    for position, op in enumerate(ops):
        exclusion = op_exclusion(op.name, op.args)
        if kernel_type_of(op.name) in VIEW_AND_ALLOCATION_OPS:
            outcomes[NOT_A_ROW_VIEW] += 1
        elif exclusion is not None:
            outcomes[exclusion] += 1
        elif not _input_slots(op.args).has_tensor:
            outcomes[NOT_A_ROW_SCALARS_ONLY] += 1
        else:
            compute.append(position)
    composite = set()
    for position in compute:
        parent = ops[position].parent
        while parent is not None and parent not in composite:
            composite.add(parent)
            parent = ops[parent].parent
    chosen = []
    for position in compute:
        if position in composite:
            outcomes[NOT_A_ROW_COMPOSITE] += 1
        else:
            chosen.append((ops[position], ops[position].dur))
    return chosen


def read_torch_trace(path: str | Path) -> ProfileTable:
    """A torch.profiler trace in the parser's row form (one row per chosen op call)."""
    path = Path(path)
    conversion = convert_trace(path)
    for outcome, count in conversion.outcomes.most_common():
        log.log(logging.WARNING if outcome in WARNING_OUTCOMES else logging.INFO, "%s: %d %s: %s", path,
                count, "device activities" if outcome == DEVICE_TIME_WITHOUT_OP else "op events", outcome)
    columns = [TYPE, *BASE_COLUMNS, INPUT_SCALARS, INPUT_STRIDES]
    if conversion.reuse_known:
        columns.append(PROFILING_INPUT_REUSE)
        log.info("%s: input reuse distances of %d calls from %s", path, conversion.reuse_known, EXECUTION_TRACE)
    if conversion.values_known:
        columns.append(PROFILING_INPUT_VALUES)
        log.info("%s: input values of %d calls from %s", path, conversion.values_known, INPUT_VALUES)
    data = {c: [row.get(c, "") for row in conversion.rows] for c in columns}
    # The GPU's power state per call (power_samples.json): counters, so each row gets their means over its calls.
    counters = list(conversion.power_fields)
    frame = pl.DataFrame({**{c: pl.Series(c, data[c], dtype=pl.String) for c in columns},
                          DURATION: pl.Series(DURATION, [float(r[DURATION]) for r in conversion.rows],
                                              dtype=pl.Float64),
                          **{c: pl.Series(c, [r.get(c) for r in conversion.rows], dtype=pl.Float64)
                             for c in counters}})
    frame = frame.with_columns(pl.col(c).cast(pl.Categorical) for c in [TYPE, *BASE_COLUMNS])
    if POWER_FIELDS[0] in counters:
        log.info("%s: power state joined from %s to %d of %d rows", path, "power_samples.json",
                 sum(1 for r in conversion.rows if r.get(POWER_FIELDS[0]) is not None), len(conversion.rows))
    if GEMM_BEFORE in counters:
        log.info("%s: the GEMM/attention history before each call (%s, over %.0f ms), for %d of %d rows", path,
                 GEMM_BEFORE, GEMM_WINDOW_US / 1000, sum(1 for r in conversion.rows if r.get(GEMM_BEFORE) is not None),
                 len(conversion.rows))
    return ProfileTable(path=path, frame=frame, counters=counters, ignored_columns=[], row_numbers=conversion.events,
                        row_unit=TRACE_EVENT,
                        attribution=conversion.attribution if conversion.attribution.device_us else None)


def trace_to_csv(trace_path: str | Path, output_path: str | Path) -> int:
    """Write a trace's rows as a kernel_details-like CSV (one row per op call; parse it like any profile)."""
    conversion = convert_trace(trace_path)
    optional = [c for c in (PROFILING_INPUT_REUSE, PROFILING_INPUT_VALUES, *conversion.power_fields)
                if any(c in row for row in conversion.rows)]
    with atomic_output(output_path) as handle:
        writer = csv.DictWriter(handle, fieldnames=[*TRACE_COLUMNS, *optional], lineterminator="\n")
        writer.writeheader()
        writer.writerows(conversion.rows)
    return len(conversion.rows)
