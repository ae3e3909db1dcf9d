"""The per-kernel CSV contract: column names and order, shape/dtype/format strings, row signatures.

Everything that reads or writes a database CSV goes through here, so the peer runtime's column names
(which it reads verbatim) live in exactly one place.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

from opperf.errors import OpperfError

# --- column names -----------------------------------------------------------------------------

OP_STATE = "OP State"
ACCELERATOR_CORE = "Accelerator Core"
INPUT_SHAPES = "Input Shapes"
INPUT_DTYPES = "Input Data Types"
INPUT_FORMATS = "Input Formats"
OUTPUT_SHAPES = "Output Shapes"
OUTPUT_DTYPES = "Output Data Types"
OUTPUT_FORMATS = "Output Formats"

BASE_COLUMNS: tuple[str, ...] = (
    OP_STATE, ACCELERATOR_CORE, INPUT_SHAPES, INPUT_DTYPES, INPUT_FORMATS,
    OUTPUT_SHAPES, OUTPUT_DTYPES, OUTPUT_FORMATS,
)
PROFILING_AVERAGE = "Profiling Average Duration(us)"
PROFILING_MEDIAN = "Profiling Median Duration(us)"
PROFILING_STD = "Profiling Std Duration(us)"
PROFILING_DURATION_COLUMNS: tuple[str, ...] = (PROFILING_AVERAGE, PROFILING_MEDIAN, PROFILING_STD)
REPLAY_AVERAGE = "Average Duration(us)"
EP_SIZE = "EP Size"

PROFILING_COUNTER_PREFIX = "Profiling Average "
MICROBENCH_COUNTER_PREFIX = "MicroBench "

SIGNATURE_COLUMNS: tuple[str, ...] = (INPUT_SHAPES, INPUT_DTYPES, INPUT_FORMATS, OUTPUT_SHAPES, OUTPUT_DTYPES)
# Kernel types whose rows are distinguished by EP size as well (the collective is part of the kernel).
EP_SIGNATURE_KERNELS = frozenset({"DispatchFFNCombine"})
# Kernel types whose calls differ by sequence lengths no shape shows (TensorCast's paged-cache ops, whose rows give
# seq_lens and query_lens in these columns: opperf.replay.hooks.tensor_cast_paged): two decode steps of one block
# count at contexts 512 and 519 are two calls, replayed and kept apart.
LENGTHS_SIGNATURE_KERNELS = frozenset({"PagedAttention", "ReshapeAndCache"})
LENGTHS_SIGNATURE_COLUMNS = ("Runtime actual_seq_lengths_kv_values", "Runtime actual_seq_lengths_values")

# Our own additions: always after every contract column, never replacing one.
SOURCE = "source"                      # profiled | generated
# On a generated row made from one of the performance model's own queries (grid --consumer-models): the framework
# op it queried (`aten.add.Tensor`). Its layout is the one the consumer's model runs at these shapes, so of rows
# the runtime cannot tell apart, with no profiled calls, it is the one the runtime gets (consumer.runtime.runtime_view).
CONSUMER_QUERY = "Consumer Query"
PROFILING_SAMPLE_COUNT = "Profiling Sample Count"
REPLAY_MEDIAN = "Replay Median Duration(us)"
REPLAY_P10 = "Replay P10 Duration(us)"
REPLAY_P90 = "Replay P90 Duration(us)"
REPLAY_CV = "Replay CV"
REPLAY_SM_CLOCK = "Replay SM Clock(MHz)"     # NVML, median over the timed calls (cuda)
PROFILED_SM_CLOCK = "Profiling Average SM Clock(MHz)"   # NVML beside the profile (opperf.workload.power)
PROFILED_POWER = "Profiling Average Power(W)"          # the same sampler: the GPU's power around the row's calls
# How long one GEMM right before each call would leave the GPU in the state the workload's GEMM/attention history
# did (opperf.power_samples.gemm_time_before), mean over the row's calls (a cuda trace; parse stage)
PROFILED_GEMM_BEFORE = "Profiling Average Equivalent GEMM Before(us)"
PROFILED_IDLE_BEFORE = "Profiling Average Idle Before(us)"
REPLAY_POWER = "Replay Power(W)"
# With phase replay (opperf.replay.phase; docs/replay.md, "Phase replay"): the mean of the row's calls replayed in the
# workload's own call order (the whole trace, or its power-capped phases); how many of the row's profiled calls those
# were; and the one-at-a-time replay mean the row had before `Average Duration(us)` became the call-weighted blend of
# the two.
REPLAY_PHASE_AVERAGE = "Replay Phase Average Duration(us)"
REPLAY_PHASE_CALLS = "Replay Phase Calls"
REPLAY_ISOLATED_AVERAGE = "Replay Isolated Average Duration(us)"
REPLAY_SAMPLE_COUNT = "Replay Sample Count"
REPLAY_TIMING_METHOD = "Replay Timing Method"
REPLAY_L2_POLICY = "Replay L2 Policy"
# What built the replayed call: `definition config/kernels/torch/mm.yaml`, or `schema aten::cumsum.default` for a
# row replayed from its op's schema with no definition (opperf.replay.schema).
REPLAY_RECIPE = "Replay Recipe"
REPLAY_STATUS = "Replay Status"         # ok | failed_build | failed_run | failed_verify | skipped_memory | ...
REPLAY_ERROR = "Replay Error"
COLLECTED_AT = "collected_at"
# Per input slot, the concrete non-tensor argument a torch.profiler trace recorded (scalars, int lists),
# `;`-aligned with Input Shapes; empty where the slot is a tensor or nothing was recorded. Replay of
# aten ops needs them (softmax dim, add alpha, ...); NPU profiles have none.
INPUT_SCALARS = "Input Scalars"
# Per input slot, the element strides a torch.profiler trace recorded, `;`-aligned with Input Shapes, written
# only for slots that are not contiguous (a transposed weight, a chunk of a fused projection, a stride-0
# expanded index); the whole field is empty when every slot is contiguous. A strided call runs another
# kernel than the contiguous one (gather with an expanded index reads one row per output row), so the
# strides are part of the row signature and replay builds the slot with exactly these strides.
INPUT_STRIDES = "Input Strides"
# Per input slot, `;`-aligned with Input Shapes: how many MiB of other data the device touched between the slot's
# tensor's previous use (its write or read) and the call, the median over the row's calls (an execution trace
# beside the profile gives the tensor identities, opperf.parse.reuse); `inf` where the tensor was not used before
# in the trace (a weight's first use), empty for non-tensor slots or where nothing was recorded. Replay's insitu
# cache state keeps resident what an LRU cache of the device's L2 size would still hold (opperf.replay.residency).
PROFILING_INPUT_REUSE = "Profiling Input Reuse Distance(MiB)"
# Per input slot, `;`-aligned with Input Shapes: the values of inputs whose values set the kernel's time (MoE
# splits: `_grouped_mm`'s offsets, a histogram's ids; a select's number of True mask elements; an index's number of
# distinct values), recorded in an un-profiled pass of the workload, as the
# row's distinct calls `values*calls` joined by `|` (opperf.input_values); replay cycles through them.
PROFILING_INPUT_VALUES = "Profiling Input Values"

# What the parse groups a row's calls by besides the contract signature (opperf.parse.aggregate): scalars and strides.
CALL_KEY_COLUMNS: tuple[str, ...] = (INPUT_SCALARS, INPUT_STRIDES)

EXTRA_COLUMNS: tuple[str, ...] = (
    SOURCE, CONSUMER_QUERY, INPUT_SCALARS, INPUT_STRIDES, PROFILING_INPUT_REUSE, PROFILING_INPUT_VALUES,
    PROFILING_SAMPLE_COUNT, REPLAY_MEDIAN,
    REPLAY_P10, REPLAY_P90, REPLAY_CV, REPLAY_SAMPLE_COUNT, REPLAY_TIMING_METHOD, REPLAY_L2_POLICY, REPLAY_RECIPE,
    REPLAY_STATUS, REPLAY_ERROR, REPLAY_SM_CLOCK, REPLAY_POWER, REPLAY_ISOLATED_AVERAGE, REPLAY_PHASE_AVERAGE,
    REPLAY_PHASE_CALLS, COLLECTED_AT,
)

# The manifest the parse checkpoint writes beside its CSVs (one kernel type per line); grid copies it.
KERNEL_TYPES_MANIFEST = "kernel_types.txt"
# The grid's record of who recorded the consumer's queries (opperf.consumer.recorder): the database build copies it
# into op_mapping.yaml's `opperf.consumer_queries`.
CONSUMER_QUERIES_RECORD = "consumer_queries.json"
# The parse's attribution accounting beside a database parsed from torch traces with device activity: per trace,
# the share of its device time that is in the CSVs and what the rest was (opperf.parse.attribution.Attribution).
TRACE_ATTRIBUTION = "trace_attribution.json"
PROFILE_OVERHEAD = "profile_overhead.json"   # parse output: each profile's profiler overhead (workload.json)
# What the reference workload ran (dtype, dims, plan), written beside its trace; the parse reads its dtype.
WORKLOAD_MANIFEST = "workload.json"
# torch.profiler's ExecutionTraceObserver output beside a cpu/cuda trace: every op's tensor identities (storage
# ids), from which the parse knows how much data the device touched between a tensor's last use and each call.
EXECUTION_TRACE = "execution_trace.json"

SOURCE_PROFILED = "profiled"
SOURCE_GENERATED = "generated"


# Raw profiler columns (kernel_details.csv, msprof op_summary_*.csv, every CANN spelling) that describe
# a launch rather than measure it: never averaged into `Profiling Average <counter>` / `MicroBench <counter>`.
# Any other numeric column of a profiler table is a counter.
PROFILER_BOOKKEEPING_COLUMNS = frozenset({
    "Step Id", "Model ID", "Model Name", "Infer ID", "Task ID", "Stream ID", "Name", "Op Name", "Type", "OP Type",
    "Op Type", "Task Type", "Start Time(us)", "Task Start Time(us)", "Task Start Time", "Duration(us)",
    "Task Duration(us)", "Wait Time(us)", "Task Wait Time(us)", "Block Dim", "Block Num", "Mix Block Dim",
    "Mix Block Num", "HF32 Eligible", "Context ID", "Device_id", "Device Id", "Device ID", "Op Flag",
    "Subtask ID", "Thread ID", "Rank ID", "Input Scalars", "Input Strides", PROFILING_INPUT_VALUES, *BASE_COLUMNS,
})


def profiling_counter_column(counter: str) -> str:
    return PROFILING_COUNTER_PREFIX + counter


def microbench_counter_column(counter: str) -> str:
    return MICROBENCH_COUNTER_PREFIX + counter


def counter_of(column: str) -> str | None:
    """The counter name of a `Profiling Average <counter>` column (None for the duration columns)."""
    if column.startswith(PROFILING_COUNTER_PREFIX) and column not in PROFILING_DURATION_COLUMNS:
        return column[len(PROFILING_COUNTER_PREFIX):]
    return None


def order_columns(columns: Iterable[str]) -> list[str]:
    """Put columns in contract order.

    Base columns; `Average Duration(us)` (if present); profiling durations; then for each counter
    `MicroBench <counter>` (if present) before `Profiling Average <counter>`; then anything else in
    first-seen order (EP Size, Runtime … columns), then our own extra columns at the very end.
    """
    columns = list(dict.fromkeys(columns))
    present = set(columns)
    ordered: list[str] = [c for c in BASE_COLUMNS if c in present]
    if REPLAY_AVERAGE in present:
        ordered.append(REPLAY_AVERAGE)
    ordered += [c for c in PROFILING_DURATION_COLUMNS if c in present]
    counters = [counter_of(c) for c in columns if counter_of(c) is not None]
    microbench_only = [c[len(MICROBENCH_COUNTER_PREFIX):] for c in columns
                       if c.startswith(MICROBENCH_COUNTER_PREFIX)
                       and c[len(MICROBENCH_COUNTER_PREFIX):] not in counters]
    for counter in counters + microbench_only:
        for column in (microbench_counter_column(counter), profiling_counter_column(counter)):
            if column in present and column not in ordered:
                ordered.append(column)
    taken = set(ordered) | set(EXTRA_COLUMNS)
    ordered += [c for c in columns if c not in taken]
    ordered += [c for c in EXTRA_COLUMNS if c in present]
    return ordered


# --- kernel type names --------------------------------------------------------------------------

_KERNEL_TYPE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+\-]*$")
# Known variant names (per-instance suffixes the profiler adds) and the type they belong to.
_KERNEL_TYPE_ALIASES = {
    "split_qkv_rmsnorm_rope_kernel_0": "split_qkv_rmsnorm_rope_kernel",
    "muls_add_kernel_1": "muls_add_kernel",
}
_KERNEL_TYPE_SUFFIX_RE = re.compile(r"^(split_qkv_rmsnorm_rope_kernel|muls_add_kernel)_\d+$")


def normalise_kernel_type(raw: str) -> str:
    """Fold known per-instance variant names onto their kernel type."""
    raw = raw.strip()
    if raw in _KERNEL_TYPE_ALIASES:
        return _KERNEL_TYPE_ALIASES[raw]
    match = _KERNEL_TYPE_SUFFIX_RE.match(raw)
    return match.group(1) if match else raw


def kernel_type_problem(kernel_type: str) -> str | None:
    """Why a kernel type cannot name a CSV file (path separators, `..`, spaces, unicode), or None."""
    if not kernel_type:
        return "empty kernel type"
    if ".." in kernel_type or "/" in kernel_type or "\\" in kernel_type:
        return f"kernel type {kernel_type!r} contains a path separator or '..'"
    if not _KERNEL_TYPE_RE.match(kernel_type):
        return (f"kernel type {kernel_type!r} is not a safe file name "
                "(allowed: ASCII letters, digits, '_', '.', '+', '-')")
    if len(kernel_type) > 200:
        return f"kernel type {kernel_type[:40]!r}... is longer than 200 characters"
    return None


def check_kernel_type(kernel_type: str, *, path=None, row=None, field="Type") -> str:
    problem = kernel_type_problem(kernel_type)
    if problem:
        raise OpperfError(problem, path=path, row=row, field=field)
    return kernel_type


# --- shape / dtype / format strings ------------------------------------------------------------

MAX_DIM = 1 << 40            # any single dimension above this is absurd
MAX_ELEMENTS = 1 << 44       # ... and so is a tensor with more elements than this
MAX_RANK = 16

Shape = tuple[int, ...]


def strip_profiler_quotes(value: object) -> str:
    """A raw profiler field as its plain string: `\"\"\"136,7168;7168,3584\"\"\"` → `136,7168;7168,3584`.

    csv already undoes one level of quoting; the profiler adds literal quotes on top. `N/A` stays `N/A`.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = str(value).strip()
    while len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1].strip()
    if text == '"':
        return ""
    return text


def split_slots(field: str) -> list[str]:
    """`a;b;;c` → ['a', 'b', '', 'c']. The empty string is one empty slot's worth of nothing: []."""
    field = strip_profiler_quotes(field)
    if field == "":
        return []
    return field.split(";")


def parse_shape(slot: str, *, path=None, row=None, field=None) -> Shape | None:
    """One tensor slot: '' → None (empty slot), '4096,512' → (4096, 512).

    A scalar has no slot text of its own in profiler output, so '' is the empty slot; a 0-d tensor
    is not representable and never invented. Strict: no expressions, no negative or absurd dims.
    """
    slot = slot.strip()
    if slot == "":
        return None
    dims = []
    for part in slot.split(","):
        part = part.strip()
        if not part.isdigit() or not part.isascii():
            raise OpperfError(f"bad dimension {part!r} in shape {slot!r}", path=path, row=row, field=field)
        value = int(part)
        if value > MAX_DIM:
            raise OpperfError(f"absurd dimension {value} in shape {slot!r}", path=path, row=row, field=field)
        dims.append(value)
    if len(dims) > MAX_RANK:
        raise OpperfError(f"shape {slot!r} has rank {len(dims)} > {MAX_RANK}", path=path, row=row, field=field)
    if math.prod(dims) > MAX_ELEMENTS:
        raise OpperfError(f"shape {slot!r} has more than 2**44 elements", path=path, row=row, field=field)
    return tuple(dims)


def parse_shapes(field_value: str, *, path=None, row=None, field=None) -> list[Shape | None]:
    """A whole shape field, slot by slot (empty slots kept as None)."""
    text = strip_profiler_quotes(field_value)
    if text.upper() == "N/A":
        raise OpperfError("shape is N/A (unknown)", path=path, row=row, field=field)
    return [parse_shape(s, path=path, row=row, field=field) for s in split_slots(text)]


def format_shape(shape: Sequence[int] | None) -> str:
    return "" if shape is None else ",".join(str(int(d)) for d in shape)


def format_shapes(shapes: Iterable[Sequence[int] | None]) -> str:
    return ";".join(format_shape(s) for s in shapes)


def parse_names(field_value: str) -> list[str]:
    """A dtype or format field, slot by slot: `DT_BF16;DT_BF16` → ['DT_BF16', 'DT_BF16']."""
    return [s.strip() for s in split_slots(field_value)]


def input_slot_count(row: Mapping[str, object]) -> int:
    """A row's input slots, one per argument of its call: the longer of `Input Shapes` and `Input Data Types` (a
    lone 0-d tensor has no shape text but has its dtype)."""
    return max(len(split_slots(str(row.get(INPUT_SHAPES, "")))), len(split_slots(str(row.get(INPUT_DTYPES, "")))))


def fractal_nz_to_nd(storage_shape: Sequence[int]) -> Shape:
    """FRACTAL_NZ storage (..., a, b, c, d) is the ND matrix (..., b*c, a*d)."""
    if len(storage_shape) < 4:
        raise ValueError(f"FRACTAL_NZ storage shape needs >= 4 dims, got {tuple(storage_shape)}")
    *batch, a, b, c, d = storage_shape
    return (*batch, b * c, a * d)


def logical_shape(shape: Shape | None, fmt: str) -> Shape | None:
    """The ND shape a tensor slot stands for, whatever its storage format."""
    if shape is None:
        return None
    if fmt.upper() == "FRACTAL_NZ" and len(shape) >= 4:
        return fractal_nz_to_nd(shape)
    return shape


# --- dtypes ------------------------------------------------------------------------------------

# Profiler dtype names (both the DT_ and the older bare spellings) → (canonical DT_ name, bytes per element).
_DTYPES: dict[str, tuple[str, float]] = {
    "DT_BF16": ("DT_BF16", 2), "BF16": ("DT_BF16", 2), "BFLOAT16": ("DT_BF16", 2),
    "DT_FLOAT16": ("DT_FLOAT16", 2), "FLOAT16": ("DT_FLOAT16", 2), "DT_FP16": ("DT_FLOAT16", 2),
    "FP16": ("DT_FLOAT16", 2), "HALF": ("DT_FLOAT16", 2),
    "DT_FLOAT": ("DT_FLOAT", 4), "FLOAT": ("DT_FLOAT", 4), "FLOAT32": ("DT_FLOAT", 4), "FP32": ("DT_FLOAT", 4),
    "DT_DOUBLE": ("DT_DOUBLE", 8), "DOUBLE": ("DT_DOUBLE", 8), "FLOAT64": ("DT_DOUBLE", 8),
    "DT_INT8": ("DT_INT8", 1), "INT8": ("DT_INT8", 1),
    "DT_UINT8": ("DT_UINT8", 1), "UINT8": ("DT_UINT8", 1),
    "DT_INT16": ("DT_INT16", 2), "INT16": ("DT_INT16", 2),
    "DT_INT32": ("DT_INT32", 4), "INT32": ("DT_INT32", 4),
    "DT_INT64": ("DT_INT64", 8), "INT64": ("DT_INT64", 8),
    "DT_BOOL": ("DT_BOOL", 1), "BOOL": ("DT_BOOL", 1),
    "DT_INT4": ("DT_INT4", 0.5), "INT4": ("DT_INT4", 0.5),
    "DT_FLOAT8_E4M3FN": ("DT_FLOAT8_E4M3FN", 1), "FLOAT8_E4M3FN": ("DT_FLOAT8_E4M3FN", 1),
    "DT_FLOAT8_E5M2": ("DT_FLOAT8_E5M2", 1), "FLOAT8_E5M2": ("DT_FLOAT8_E5M2", 1),
    "DT_COMPLEX64": ("DT_COMPLEX64", 8), "COMPLEX64": ("DT_COMPLEX64", 8),
}
# torch dtype name (str(torch.bfloat16) without "torch.") → profiler name, for CPU/CUDA traces.
TORCH_TO_PROFILER_DTYPE = {
    "bfloat16": "DT_BF16", "float16": "DT_FLOAT16", "half": "DT_FLOAT16", "float32": "DT_FLOAT",
    "float": "DT_FLOAT", "float64": "DT_DOUBLE", "double": "DT_DOUBLE", "int8": "DT_INT8", "uint8": "DT_UINT8",
    "int16": "DT_INT16", "int32": "DT_INT32", "int": "DT_INT32", "int64": "DT_INT64", "long": "DT_INT64",
    "bool": "DT_BOOL", "float8_e4m3fn": "DT_FLOAT8_E4M3FN", "float8_e5m2": "DT_FLOAT8_E5M2",
    "complex64": "DT_COMPLEX64",
}
# c10::ScalarType codes as torch.profiler records a `ScalarType dtype` argument in `Concrete Inputs` → torch dtype name.
SCALAR_TYPE_NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                     7: "float64", 9: "complex64", 10: "complex128", 11: "bool", 15: "bfloat16", 23: "float8_e5m2",
                     24: "float8_e4m3fn"}
# torch.profiler's record_shapes spelling ("c10::BFloat16", "float", "long int") → torch dtype name.
PROFILER_TYPE_TO_TORCH = {
    "c10::BFloat16": "bfloat16", "c10::Half": "float16", "float": "float32", "double": "float64",
    "signed char": "int8", "unsigned char": "uint8", "short int": "int16", "int": "int32",
    "long int": "int64", "long": "int64", "bool": "bool", "c10::Float8_e4m3fn": "float8_e4m3fn",
    "c10::Float8_e5m2": "float8_e5m2", "c10::complex<float>": "complex64",
}


def canonical_dtype(name: str, *, path=None, row=None, field=None) -> str:
    """`FLOAT16` → `DT_FLOAT16`; unknown names are an error naming the field."""
    key = name.strip().upper()
    if key not in _DTYPES:
        raise OpperfError(f"unknown data type {name!r}", path=path, row=row, field=field)
    return _DTYPES[key][0]


def dtype_bytes(name: str, *, path=None, row=None, field=None) -> float:
    key = name.strip().upper()
    if key not in _DTYPES:
        raise OpperfError(f"unknown data type {name!r}", path=path, row=row, field=field)
    return _DTYPES[key][1]


def is_known_dtype(name: str) -> bool:
    return name.strip().upper() in _DTYPES


# --- strides -------------------------------------------------------------------------------------

Strides = tuple[int, ...]


def contiguous_strides(shape: Sequence[int]) -> Strides:
    """Row-major element strides of a dense tensor of `shape`."""
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Dense row-major layout, ignoring the stride of size-1 dims (as torch's is_contiguous does)."""
    if len(shape) != len(strides):
        return False
    return all(size == 1 or stride == expected
               for size, stride, expected in zip(shape, strides, contiguous_strides(shape)))


def parse_strides(slot: str, *, path=None, row=None, field=INPUT_STRIDES) -> Strides | None:
    """One slot of Input Strides: '' → None (contiguous or not a tensor), '8192,32,512,1' → (8192, 32, 512, 1)."""
    slot = slot.strip()
    if slot == "":
        return None
    values = []
    for part in slot.split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit():
            raise OpperfError(f"bad stride {part!r} in {slot!r} (non-negative integers only)", path=path, row=row,
                              field=field)
        values.append(int(part))
    return tuple(values)


def strides_text(shapes: Sequence[Sequence[int] | None], strides: Sequence[Sequence[int] | None]) -> str:
    """The Input Strides field for slot shapes and recorded strides: only non-contiguous slots are written,
    and a row whose slots are all contiguous gets the empty field."""
    slots = []
    for shape, slot_strides in zip(shapes, strides):
        written = (shape is not None and slot_strides is not None and len(slot_strides) == len(shape)
                   and not is_contiguous(shape, slot_strides))
        slots.append(",".join(str(int(s)) for s in slot_strides) if written else "")
    return ";".join(slots) if any(slots) else ""


def canonical_strides(strides_field: str, shapes_field: str) -> str:
    """Input Strides in its one spelling (contiguous slots dropped), for signatures; unparseable text kept as is."""
    try:
        shapes = [parse_shape(s) for s in split_slots(shapes_field)]
        strides = [parse_strides(s) for s in split_slots(strides_field)]
    except OpperfError:
        return strides_field
    strides += [None] * (len(shapes) - len(strides))
    # A size-1 dim's stride says nothing about the layout (torch ignores it too): one spelling for all.
    strides = [None if shape is None or slot is None or len(slot) != len(shape)
               else tuple(0 if size == 1 else stride for size, stride in zip(shape, slot))
               for shape, slot in zip(shapes, strides[:len(shapes)])]
    return strides_text(shapes, strides)


# --- row signatures ------------------------------------------------------------------------------

Signature = tuple[str, ...]


def canonical_field(column: str, value: object) -> str:
    """A field in one spelling, slots kept: `FLOAT16` → `DT_FLOAT16`, `FORMAT_ND` → `ND`, quotes and spaces dropped."""
    text = strip_profiler_quotes(value)
    if column in (INPUT_DTYPES, OUTPUT_DTYPES):
        return ";".join(canonical_dtype(s) if is_known_dtype(s) else s.strip() for s in text.split(";")) if text else ""
    if column in (INPUT_FORMATS, OUTPUT_FORMATS):
        return ";".join(s.strip().upper().removeprefix("FORMAT_") for s in text.split(";")) if text else ""
    if column in (INPUT_SHAPES, OUTPUT_SHAPES):
        return ";".join(",".join(d.strip() for d in slot.split(",")) if slot.strip() else ""
                        for slot in text.split(";")) if text else ""
    return text


def lengths_text(value: object) -> str:
    """A list of lengths in one spelling: `513, 513` ≡ `[513,513]` ≡ `513;513` → `513,513`; other text as it is."""
    text = strip_profiler_quotes(value).strip().strip("[]")
    return ",".join(part.strip() for part in text.replace(";", ",").split(",")) if text else ""


def row_signature(row: Mapping[str, object], kernel_type: str | None = None) -> Signature:
    """The key that matches a replay result to a database row.

    Five columns (Input Shapes, Input Data Types, Input Formats, Output Shapes, Output Data Types),
    plus the non-contiguous Input Strides where a row has them, plus EP Size for DispatchFFNCombine, plus the
    sequence and query lengths for TensorCast's paged-cache ops (LENGTHS_SIGNATURE_KERNELS).
    Spellings are canonicalised (FLOAT16 ≡ DT_FLOAT16, FORMAT_ND ≡ ND, literal profiler quotes dropped,
    contiguous strides ≡ none recorded) so old and new files match.
    """
    signature = tuple(canonical_field(c, row.get(c, "")) for c in SIGNATURE_COLUMNS)
    strides = strip_profiler_quotes(row.get(INPUT_STRIDES, ""))
    strides = canonical_strides(strides, strip_profiler_quotes(row.get(INPUT_SHAPES, ""))) if strides else ""
    if strides:
        signature += ("strides=" + strides,)
    if kernel_type in LENGTHS_SIGNATURE_KERNELS:
        signature += tuple(lengths_text(row.get(column, "")) for column in LENGTHS_SIGNATURE_COLUMNS)
    if kernel_type in EP_SIGNATURE_KERNELS:
        ep = strip_profiler_quotes(row.get(EP_SIZE, ""))
        try:
            ep = str(int(float(ep))) if ep else ""
        except ValueError:
            pass
        signature += (ep,)
    return signature
