"""Kernel definitions: what each kernel type's replay calls and how its inputs are built from a row.

One small YAML file per kernel type under `config/kernels/<family>/<Type>.yaml` (families: `torch`
for the cpu/cuda aten ops, `npu` for Ascend kernels). The file is declarative; a Python hook module
is named only where a kernel's slots need logic. This module owns the schema: it loads, validates
(every mistake is an OpperfError naming the file and the field) and indexes the files. It imports no
torch, so Snakefiles and the database stage (op_mapping.yaml) can use it cheaply.

Schema (see docs/replay.md, "Kernel definition reference"):

    type: MatMulV2                    # the profiler's Type == the file's stem
    backends: [npu]                   # any of npu, cuda, cpu
    category: matmul                  # one of CATEGORIES
    api: torch.mm                     # dotted callable (torch.*, torch_npu.*, torch.ops.*); omit only with a hook
    import_modules: [torch_npu]       # modules to import before resolving `api` (registers torch.ops namespaces)
    framework_ops: [aten.mm.default]  # op_mapping.yaml: the ops the performance model (TensorCast) issues
                                      # that this kernel type answers, as its dispatch records them; an
                                      # entry may carry its own runtime fields:
                                      # {op: tensor_cast.add_rms_norm2.default, tc_input_count: 3}
    alternate_kernel_types: [MatMulV3, MatMulCommon]
    inputs:                           # one entry per slot of "Input Shapes", in order
      - {role: tensor}                # random values of the slot's shape/dtype
      - {role: tensor, transpose: [0, 1]}          # view transform after building (recorded Input Strides win)
      - {role: tensor, cache: cold}   # in the workload it is read from memory (a weight); default warm:
                                      # produced by the kernel just before, resident in L2 (the insitu policy)
      - {role: index, high: {slot: 0, dim: 0}}     # integers in [low, high)
      - {role: scalar, from: input_scalars}        # the row's `Input Scalars` slot
      - {role: scalar, value: 1.0e-6, name: eps}   # a fixed value, passed as keyword `eps`
      - {role: device, name: device}  # the replay device (factory ops: empty, empty_strided, ...)
      - {role: dtype, name: dtype}    # the ScalarType the slot recorded (a code: 6 = float32), left out if none
      - {role: none}                  # empty/optional slot: passed as None (omit: true leaves it out)
      - {role: tensor, name: out, optional: true}  # trailing slot a row may lack (`optional` on any role)
    overloads:                        # the op's other argument layouts rows of this Type are recorded in, each
      - api: torch.ops.aten.arange.start_out       # told apart by its slot count (`api` defaults to the top one)
        inputs: [...]
    kwargs: {epsilon: 1.0e-6}         # fixed keyword arguments
    dtype_overrides: {1: DT_INT8}     # slot index -> dtype forced regardless of the row
    outputs: {verify: true}           # verify produced outputs against Output Shapes / Output Data Types
    hook: opperf.replay.hooks.npu_fused_infer_attention   # module with build_case(row, ctx) -> ReplayCase
                                      # (opperf.replay.schema: built from the op's schema, as a Type with no file)
    requires_custom_opp: true         # check ASCEND_CUSTOM_OPP_PATH / LD_LIBRARY_PATH before replaying
    op_mapping: {query_mode: elementwise}   # extra fields the peer runtime reads from op_mapping.yaml
    runtime_policies:                 # the runtime's per-kernel policies (op_mapping.yaml's *_policy keys)
      interpolation: {max_interpolation_dim: 1}
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from opperf.contract import check_kernel_type, is_known_dtype, canonical_dtype
from opperf.errors import OpperfError
from opperf.yaml_files import field_error, read_yaml

SCHEMA_HOOK = "opperf.replay.schema"
# Back ends whose Types are op names (torch traces): a Type with no definition replays from its op's schema.
SCHEMA_BACKENDS = ("cpu", "cuda")
SCHEMA_PREFIX = "schema:"
REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEFINITIONS_DIR = REPOSITORY_ROOT / "config" / "kernels"
BACKENDS = ("cpu", "cuda", "npu")
CATEGORIES = ("matmul", "quant", "attention", "norm", "rope", "kv_cache", "activation", "elementwise",
              "memory", "shape", "moe", "sampling", "reduction", "embedding", "communication")
ROLES = ("tensor", "index", "scalar", "device", "dtype", "none")
VALUE_KINDS = ("normal", "uniform", "positive", "ones", "zeros")
# Where an input lives when the kernel runs inside the model: `warm` (an activation just written by the
# previous kernel: in L2 as far as it fits) or `cold` (a weight, an embedding table: read from memory).
CACHE_STATES = ("warm", "cold")

_TOP_KEYS = {"type", "backends", "category", "api", "import_modules", "framework_ops", "alternate_kernel_types",
             "inputs", "overloads", "kwargs", "dtype_overrides", "outputs", "hook", "requires_custom_opp", "description",
             "op_mapping", "runtime_policies", "memcpy_when_dense"}
# Per-mapping fields of op_mapping.yaml that the peer runtime (msmodeling tensor_cast ProfilingDataSource) reads
# and a definition may state: how its rows are matched (elementwise by output shape, FIA by runtime metadata,
# fused MoE with EP size) and how many leading framework tensor inputs to compare with the CSV's slots.
RUNTIME_QUERY_MODES = ("elementwise", "attention_special", "moe_fused")
_OP_MAPPING_KEYS = {"query_mode", "tc_input_count"}
# op_mapping.yaml's policy sections, each `{name}_policy: {kernel_overrides: {Type: {...}}}` in the runtime.
RUNTIME_POLICIES = ("interpolation", "latency", "query_selection")
_COMMON_KEYS = {"role", "name", "optional"}
_ROLE_KEYS = {
    "tensor": _COMMON_KEYS | {"transpose", "values", "contiguous", "cache"},
    "index": _COMMON_KEYS | {"low", "high", "unique", "sorted", "cache"},
    "scalar": _COMMON_KEYS | {"from", "value"},
    "device": _COMMON_KEYS,
    "dtype": _COMMON_KEYS,
    "none": _COMMON_KEYS | {"omit"},
}
_OVERLOAD_KEYS = {"api", "inputs"}
_OUTPUT_KEYS = {"verify", "extra", "slots"}
_DOTTED_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class IndexBound:
    """An index input's exclusive upper bound: a constant, or a dimension of another input slot.

    `dim` may itself come from a scalar slot (`dim_from_scalar_slot`), as in `index_select(self, dim, index)`.
    """

    constant: int | None = None
    scalar_slot: int | None = None             # the value recorded in this Input Scalars slot (bincount's minlength)
    slot: int | None = None
    dim: int | None = None
    dim_from_scalar_slot: int | None = None


@dataclass(frozen=True)
class InputSpec:
    """How one slot of a row's `Input Shapes` becomes an argument of the call."""

    role: str                                  # tensor | index | scalar | device | dtype | none
    name: str | None = None                    # pass as keyword `name` instead of positionally
    transpose: tuple[int, int] | None = None   # tensor: build the slot's shape, then .transpose(a, b) (a view)
    contiguous: bool = False                   # tensor: make the transformed view contiguous
    values: str = "normal"                     # tensor: normal | uniform | positive | ones | zeros
    low: int = 0                               # index: inclusive lower bound
    high: IndexBound | None = None             # index: exclusive upper bound
    unique: bool = False                       # index: distinct values (scatter targets, cache slots)
    sorted: bool = False                       # index: non-decreasing values
    scalar_from: str | None = None             # scalar: "input_scalars"
    value: Any = None                          # scalar: fixed value
    omit: bool = False                         # none: leave the argument out entirely
    optional: bool = False                     # trailing slot a row may lack (e.g. an `out=` variant's out)
    cache: str = "warm"                        # tensor/index: in-situ cache state (CACHE_STATES)


@dataclass(frozen=True)
class Layout:
    """One argument layout of a definition: the callable and one InputSpec per `Input Shapes` slot. A row takes
    the layout whose slot count it has (an op's overloads differ in their argument count)."""

    api: str | None
    inputs: tuple[InputSpec, ...]
    where: str = "inputs"                      # where the file states it: `inputs`, `overloads[0]`

    @property
    def slot_counts(self) -> range:
        """The slot counts this layout takes: its entries, less any trailing optional ones."""
        return range(sum(not spec.optional for spec in self.inputs), len(self.inputs) + 1)


@dataclass(frozen=True)
class OutputSpec:
    verify: bool = True
    extra: str = "error"                       # error | ignore: outputs produced beyond the row's slots
    slots: int | None = None                   # verify only the first N output slots (the rest: auxiliary state)


@dataclass(frozen=True)
class KernelDefinition:
    """One kernel type's replay recipe, as loaded and validated from its YAML file."""

    type: str
    backends: tuple[str, ...]
    category: str
    api: str | None
    path: Path
    framework_ops: tuple[str, ...] = ()
    framework_op_fields: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # per-op runtime fields
    alternate_kernel_types: tuple[str, ...] = ()
    inputs: tuple[InputSpec, ...] = ()
    overloads: tuple[Layout, ...] = ()           # the op's other argument layouts (told apart by slot count)
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    dtype_overrides: Mapping[int, str] = field(default_factory=dict)
    outputs: OutputSpec = OutputSpec()
    hook: str | None = None
    requires_custom_opp: bool = False
    import_modules: tuple[str, ...] = ()
    description: str = ""
    op_mapping: Mapping[str, Any] = field(default_factory=dict)   # runtime fields for op_mapping.yaml
    runtime_policies: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    schema_op: str | None = None      # `aten::cumsum`: built from the op's schema (no file, or hook opperf.replay.schema)
    # The op's CUDA work is ATen's copy_: one cudaMemcpyAsync device-to-device, not a kernel, when source and
    # destination share a dtype and one dense layout; its time then steps with the byte count (execution_branch).
    memcpy_when_dense: bool = False

    @property
    def reference(self) -> str:
        """How a job names this recipe: the definition file, or `schema:<ns>::<op>`."""
        return f"{SCHEMA_PREFIX}{self.schema_op}" if self.schema_op else str(self.path)

    @property
    def source(self) -> str:
        """The file as a database may name it: by its repository path (the same on every host), else relative to
        the working directory, else by its name alone; never the builder's absolute directories."""
        return portable_path(self.path)

    @property
    def recipe(self) -> str:
        """The `Replay Recipe` of rows replayed from it (a schema recipe names its overload once it is chosen)."""
        if self.schema_op:
            return f"schema {self.schema_op}"
        return f"definition {self.source}"

    @property
    def layouts(self) -> tuple[Layout, ...]:
        """Every argument layout: `inputs` first, then `overloads`; none for a hook that builds its own call."""
        if not self.inputs:
            return ()
        return (Layout(self.api, self.inputs), *self.overloads)

    def layout_for(self, slot_count: int) -> Layout | None:
        """The layout a row of `slot_count` input slots is built with, or None when none takes that many."""
        return next((layout for layout in self.layouts if slot_count in layout.slot_counts), None)

    def slot_counts_text(self) -> str:
        """The input slot counts this definition takes, in words: `2`, `1 to 2`, `5, 6, 7 or 4`."""
        words = [str(c.start) if len(c) == 1 else f"{c.start} to {c.stop - 1}"
                 for c in (layout.slot_counts for layout in self.layouts)]
        return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"

    def out_slots(self, slot_count: int) -> tuple[int, ...]:
        """The input slots that are `out=` arguments (named `out`) in a row of `slot_count` slots."""
        layout = self.layout_for(slot_count)
        if layout is None:
            return ()
        return tuple(i for i, spec in enumerate(layout.inputs[:slot_count]) if spec.name == "out")

    @property
    def kernel_types(self) -> tuple[str, ...]:
        """Every Type this definition replays (its own and the alternates the profiler may report)."""
        return (self.type, *self.alternate_kernel_types)

    def supports(self, backend: str) -> bool:
        return backend in self.backends


def portable_path(path: str | Path) -> str:
    """`path` as a file written for other hosts names it: relative to the repository, else to the working
    directory, else its name alone."""
    resolved = Path(path).resolve()
    for base in (REPOSITORY_ROOT, Path.cwd().resolve()):
        try:
            return str(resolved.relative_to(base))
        except ValueError:
            continue
    return Path(path).name


# --- validation helpers -------------------------------------------------------------------------

def _fail(message: str, path: Path, field_name: str) -> OpperfError:
    return field_error(message, path, field_name)


def _string_list(raw: Any, path: Path, field_name: str, *, pattern: re.Pattern | None = None) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise _fail(f"must be a list of non-empty strings, got {raw!r}", path, field_name)
    if pattern is not None:
        for item in raw:
            if not pattern.match(item):
                raise _fail(f"{item!r} is not a dotted name", path, field_name)
    return tuple(raw)


def _boolean(raw: Any, path: Path, field_name: str, default: bool = False) -> bool:
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise _fail(f"must be true or false, got {raw!r}", path, field_name)
    return raw


def _integer(raw: Any, path: Path, field_name: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise _fail(f"must be an integer, got {raw!r}", path, field_name)
    return raw


def _check_keys(entry: Mapping, allowed: set[str], path: Path, field_name: str) -> None:
    unknown = sorted(set(entry) - allowed, key=str)
    if unknown:
        where = str(unknown[0]) if field_name == "(top level)" else f"{field_name}.{unknown[0]}"
        raise _fail(f"unknown key(s) {unknown}; allowed: {sorted(allowed)}", path, where)


def _index_bound(raw: Any, path: Path, field_name: str, slot_count: int) -> IndexBound:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw <= 0:
            raise _fail(f"must be positive, got {raw}", path, field_name)
        return IndexBound(constant=raw)
    if not isinstance(raw, Mapping):
        raise _fail(f"must be an integer or {{slot: i, dim: d}}, got {raw!r}", path, field_name)
    _check_keys(raw, {"slot", "dim", "dim_from_scalar_slot", "scalar_slot"}, path, field_name)
    if "scalar_slot" in raw:
        if len(raw) != 1:
            raise _fail("`scalar_slot` stands alone (the bound is that slot's recorded value)", path, field_name)
        scalar_slot = _integer(raw["scalar_slot"], path, f"{field_name}.scalar_slot")
        if not 0 <= scalar_slot < slot_count:
            raise _fail(f"slot {scalar_slot} is not one of the {slot_count} input slots", path,
                        f"{field_name}.scalar_slot")
        return IndexBound(scalar_slot=scalar_slot)
    if "slot" not in raw:
        raise _fail("needs `slot` (the input slot whose dimension bounds the indices)", path, field_name)
    slot = _integer(raw["slot"], path, f"{field_name}.slot")
    if not 0 <= slot < slot_count:
        raise _fail(f"slot {slot} is not one of the {slot_count} input slots", path, f"{field_name}.slot")
    has_dim, has_scalar = "dim" in raw, "dim_from_scalar_slot" in raw
    if has_dim == has_scalar:
        raise _fail("give exactly one of `dim` and `dim_from_scalar_slot`", path, field_name)
    if has_dim:
        return IndexBound(slot=slot, dim=_integer(raw["dim"], path, f"{field_name}.dim"))
    scalar_slot = _integer(raw["dim_from_scalar_slot"], path, f"{field_name}.dim_from_scalar_slot")
    if not 0 <= scalar_slot < slot_count:
        raise _fail(f"slot {scalar_slot} is not one of the {slot_count} input slots", path,
                    f"{field_name}.dim_from_scalar_slot")
    return IndexBound(slot=slot, dim_from_scalar_slot=scalar_slot)


def _input_spec(raw: Any, index: int, slot_count: int, path: Path, prefix: str = "") -> InputSpec:
    field_name = f"{prefix}inputs[{index}]"
    if not isinstance(raw, Mapping):
        raise _fail(f"must be a mapping such as {{role: tensor}}, got {raw!r}", path, field_name)
    role = raw.get("role")
    if role not in ROLES:
        raise _fail(f"role {role!r} is not one of {ROLES}", path, f"{field_name}.role")
    _check_keys(raw, _ROLE_KEYS[role], path, field_name)
    optional = _boolean(raw.get("optional"), path, f"{field_name}.optional")
    name = raw.get("name")
    if name is not None and not (isinstance(name, str) and _IDENTIFIER_RE.match(name)):
        raise _fail(f"keyword name {name!r} is not an identifier", path, f"{field_name}.name")
    cache = raw.get("cache", "warm")
    if cache not in CACHE_STATES:
        raise _fail(f"{cache!r} is not one of {CACHE_STATES}", path, f"{field_name}.cache")
    if role == "tensor":
        transpose = raw.get("transpose")
        if transpose is not None:
            if (not isinstance(transpose, list) or len(transpose) != 2
                    or not all(isinstance(d, int) and not isinstance(d, bool) for d in transpose)):
                raise _fail(f"must be two dimension indices such as [0, 1], got {transpose!r}", path,
                            f"{field_name}.transpose")
            transpose = (transpose[0], transpose[1])
        values = raw.get("values", "normal")
        if values not in VALUE_KINDS:
            raise _fail(f"{values!r} is not one of {VALUE_KINDS}", path, f"{field_name}.values")
        return InputSpec(role=role, name=name, optional=optional, transpose=transpose, values=values, cache=cache,
                         contiguous=_boolean(raw.get("contiguous"), path, f"{field_name}.contiguous"))
    if role == "index":
        low = _integer(raw.get("low", 0), path, f"{field_name}.low")
        if low < 0:
            raise _fail(f"must be >= 0, got {low}", path, f"{field_name}.low")
        if "high" not in raw:
            raise _fail("an index input needs `high` (a constant or {slot: i, dim: d}) so its values stay in "
                        "bounds", path, f"{field_name}.high")
        return InputSpec(role=role, name=name, optional=optional, low=low, cache=cache,
                         high=_index_bound(raw["high"], path, f"{field_name}.high", slot_count),
                         unique=_boolean(raw.get("unique"), path, f"{field_name}.unique"),
                         sorted=_boolean(raw.get("sorted"), path, f"{field_name}.sorted"))
    if role == "scalar":
        has_from, has_value = "from" in raw, "value" in raw
        if has_from == has_value:
            raise _fail("give exactly one of `from: input_scalars` and `value: <literal>`", path, field_name)
        if has_from and raw["from"] != "input_scalars":
            raise _fail(f"only `input_scalars` is supported, got {raw['from']!r}", path, f"{field_name}.from")
        value = raw.get("value")
        if has_value and not _is_plain_literal(value):
            raise _fail(f"must be a number, boolean, string, null or a list of those, got {value!r}", path,
                        f"{field_name}.value")
        return InputSpec(role=role, name=name, optional=optional, scalar_from=raw.get("from"), value=value)
    if role in ("device", "dtype"):
        return InputSpec(role=role, name=name, optional=optional)
    return InputSpec(role=role, name=name, optional=optional, omit=_boolean(raw.get("omit"), path, f"{field_name}.omit"))


def _is_plain_literal(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, list) and all(_is_plain_literal(v) for v in value)


def parse_definition(raw: Any, path: str | Path) -> KernelDefinition:
    """Validate one definition's YAML content (already loaded) into a KernelDefinition."""
    path = Path(path)
    if not isinstance(raw, Mapping):
        raise _fail("a kernel definition must be a YAML mapping", path, "type")
    _check_keys(raw, _TOP_KEYS, path, "(top level)")
    kernel_type = raw.get("type")
    if not isinstance(kernel_type, str):
        raise _fail("missing or not a string", path, "type")
    check_kernel_type(kernel_type, path=path, field="type")
    if path.suffix in (".yaml", ".yml") and path.stem != kernel_type:
        raise _fail(f"the file must be named {kernel_type}.yaml (one file per kernel type, so editing it "
                    "re-runs exactly that kernel)", path, "type")

    backends = _string_list(raw.get("backends"), path, "backends")
    if not backends:
        raise _fail(f"list the back ends this definition replays on (any of {BACKENDS})", path, "backends")
    for backend in backends:
        if backend not in BACKENDS:
            raise _fail(f"back end {backend!r} is not one of {BACKENDS}", path, "backends")

    category = raw.get("category")
    if category not in CATEGORIES:
        raise _fail(f"category {category!r} is not one of {CATEGORIES}", path, "category")

    api = raw.get("api")
    hook = raw.get("hook")
    for name, value in (("api", api), ("hook", hook)):
        if value is not None and not (isinstance(value, str) and _DOTTED_RE.match(value)):
            raise _fail(f"must be a dotted Python name, got {value!r}", path, name)
    if api is None and hook is None:
        raise _fail("give `api` (the callable the replay calls), or a `hook` module that builds the call", path,
                    "api")

    alternates = _string_list(raw.get("alternate_kernel_types"), path, "alternate_kernel_types")
    for alternate in alternates:
        check_kernel_type(alternate, path=path, field="alternate_kernel_types")
    if kernel_type in alternates:
        raise _fail(f"{kernel_type!r} lists itself as an alternate", path, "alternate_kernel_types")

    raw_inputs = raw.get("inputs", [])
    if not raw_inputs and hook is None:
        raise _fail("a declarative definition needs one entry per Input Shapes slot", path, "inputs")
    inputs = _layout_inputs(raw_inputs, path)
    keyword_names = [spec.name for spec in inputs if spec.name]
    overloads = _overloads(raw.get("overloads"), path, api, hook, inputs)

    kwargs = raw.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise _fail("must be a mapping of keyword -> literal", path, "kwargs")
    for key, value in kwargs.items():
        if not (isinstance(key, str) and _IDENTIFIER_RE.match(key)):
            raise _fail(f"keyword {key!r} is not an identifier", path, "kwargs")
        if not _is_plain_literal(value):
            raise _fail(f"value of {key!r} must be a number, boolean, string, null or list", path, f"kwargs.{key}")
        if key in keyword_names or any(key == spec.name for layout in overloads for spec in layout.inputs):
            raise _fail(f"{key!r} is both a fixed kwarg and an input slot's keyword", path, f"kwargs.{key}")

    overrides_raw = raw.get("dtype_overrides") or {}
    if not isinstance(overrides_raw, Mapping):
        raise _fail("must be a mapping of slot index -> dtype", path, "dtype_overrides")
    dtype_overrides = {}
    widest = max([len(inputs), *(len(layout.inputs) for layout in overloads)])
    for slot, dtype in overrides_raw.items():
        slot = _integer(slot, path, "dtype_overrides")
        if inputs and not 0 <= slot < widest:
            raise _fail(f"slot {slot} is not one of the {widest} input slots", path, "dtype_overrides")
        if not isinstance(dtype, str) or not is_known_dtype(dtype):
            raise _fail(f"unknown data type {dtype!r}", path, f"dtype_overrides.{slot}")
        dtype_overrides[slot] = canonical_dtype(dtype)

    outputs_raw = raw.get("outputs", {})
    if outputs_raw is None:
        outputs_raw = {}
    if not isinstance(outputs_raw, Mapping):
        raise _fail("must be a mapping such as {verify: true}", path, "outputs")
    _check_keys(outputs_raw, _OUTPUT_KEYS, path, "outputs")
    extra = outputs_raw.get("extra", "error")
    if extra not in ("error", "ignore"):
        raise _fail(f"must be `error` or `ignore`, got {extra!r}", path, "outputs.extra")
    slots = outputs_raw.get("slots")
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 1):
        raise _fail(f"must be a positive integer (the leading output slots to verify), got {slots!r}", path,
                    "outputs.slots")
    outputs = OutputSpec(verify=_boolean(outputs_raw.get("verify"), path, "outputs.verify", default=True),
                         extra=extra, slots=slots)

    description = raw.get("description", "")
    if not isinstance(description, str):
        raise _fail("must be a string", path, "description")

    op_mapping = _runtime_fields(raw.get("op_mapping") or {}, path, "op_mapping")
    framework_ops, framework_op_fields = _framework_ops(raw.get("framework_ops"), path)
    policies = raw.get("runtime_policies") or {}
    if not isinstance(policies, Mapping):
        raise _fail("must be a mapping such as {interpolation: {max_interpolation_dim: 1}}", path, "runtime_policies")
    _check_keys(policies, set(RUNTIME_POLICIES), path, "runtime_policies")
    for name, value in policies.items():
        if not isinstance(value, Mapping) or not value:
            raise _fail("must be a non-empty mapping of the runtime's fields", path, f"runtime_policies.{name}")

    return KernelDefinition(
        type=kernel_type, backends=backends, category=category, api=api, path=path,
        framework_ops=framework_ops, framework_op_fields=framework_op_fields,
        alternate_kernel_types=alternates, inputs=inputs, overloads=overloads, kwargs=dict(kwargs), dtype_overrides=dtype_overrides,
        outputs=outputs, hook=hook,
        requires_custom_opp=_boolean(raw.get("requires_custom_opp"), path, "requires_custom_opp"),
        import_modules=_string_list(raw.get("import_modules"), path, "import_modules", pattern=_DOTTED_RE),
        description=description, op_mapping=dict(op_mapping),
        runtime_policies={name: dict(value) for name, value in policies.items()},
        memcpy_when_dense=_boolean(raw.get("memcpy_when_dense"), path, "memcpy_when_dense"),
        # A file whose hook is the schema's states only what a schema cannot (the runtime's fields, policies).
        schema_op=schema_op_for(kernel_type) if hook == SCHEMA_HOOK else None,
    )


def _layout_inputs(raw_inputs: Any, path: Path, prefix: str = "") -> tuple[InputSpec, ...]:
    """One layout's `inputs`: one entry per slot, optional ones last, keyword names once each."""
    if not isinstance(raw_inputs, list):
        raise _fail("must be a list with one entry per Input Shapes slot", path, f"{prefix}inputs")
    inputs = tuple(_input_spec(entry, i, len(raw_inputs), path, prefix) for i, entry in enumerate(raw_inputs))
    for index in range(1, len(inputs)):
        if inputs[index - 1].optional and not inputs[index].optional:
            raise _fail("optional entries must come last (a row may only lack trailing slots)", path,
                        f"{prefix}inputs[{index}]")
    keyword_names = [spec.name for spec in inputs if spec.name]
    if len(set(keyword_names)) != len(keyword_names):
        raise _fail(f"keyword names repeat: {keyword_names}", path, f"{prefix}inputs")
    return inputs


def _overloads(raw: Any, path: Path, api: str | None, hook: str | None,
               inputs: tuple[InputSpec, ...]) -> tuple[Layout, ...]:
    """`overloads`: the op's other argument layouts, each taking slot counts no other layout takes (a row's
    slot count picks its layout)."""
    if raw is None:
        return ()
    if hook is not None or not inputs:
        raise _fail("overloads extend a declarative definition's `inputs` (a hook builds every layout itself)", path,
                    "overloads")
    if not isinstance(raw, list) or not raw:
        raise _fail("must be a non-empty list such as [{api: torch.ops.aten.sort.stable, inputs: [...]}]", path,
                    "overloads")
    layouts = [Layout(api, inputs)]
    for index, entry in enumerate(raw):
        where = f"overloads[{index}]"
        if not isinstance(entry, Mapping):
            raise _fail(f"must be a mapping such as {{api: ..., inputs: [...]}}, got {entry!r}", path, where)
        _check_keys(entry, _OVERLOAD_KEYS, path, where)
        own_api = entry.get("api", api)
        if not (isinstance(own_api, str) and _DOTTED_RE.match(own_api)):
            raise _fail(f"must be a dotted Python name, got {own_api!r}", path, f"{where}.api")
        if not entry.get("inputs"):
            raise _fail("needs its `inputs`, one entry per Input Shapes slot", path, f"{where}.inputs")
        layout = Layout(own_api, _layout_inputs(entry["inputs"], path, f"{where}."), where)
        for other in layouts:
            shared = sorted(set(layout.slot_counts) & set(other.slot_counts))
            if shared:
                raise _fail(f"takes {shared[0]} input slots, as {other.where} does: each layout needs slot counts "
                            "of its own (a row's count picks its layout)", path, f"{where}.inputs")
        layouts.append(layout)
    return tuple(layouts[1:])


def check_rows_fit(definition: KernelDefinition, slot_counts: Iterable[int], rows_path: str | Path) -> int:
    """The rows (their input slot counts) that `definition` builds; an OpperfError naming the file, the kernel type
    and both counts when it builds none of them (a definition that fits no row of its type is a mistake in it, not
    a reason to build every row from the op's schema). A hook builds every layout itself: all rows."""
    counts = list(slot_counts)
    if not definition.layouts or definition.schema_op:
        return len(counts)
    fitting = sum(definition.layout_for(count) is not None for count in counts)
    if counts and not fitting:
        seen = sorted(set(counts))
        rows_text = (f"the {len(counts)} rows of {rows_path} have" if len(counts) > 1 else f"the row of {rows_path} has")
        raise OpperfError(f"kernel type {definition.type!r}: the definition declares {definition.slot_counts_text()} "
                          f"input slots, {rows_text} {', '.join(map(str, seen[:-1])) + ' or ' if len(seen) > 1 else ''}"
                          f"{seen[-1]}; it fits no row (give `inputs`, or an `overloads` entry, one entry per slot)",
                          path=definition.path, field="inputs")
    return fitting


def _runtime_fields(fields: Any, path: Path, field_name: str) -> dict[str, Any]:
    """op_mapping.yaml fields a definition (or one of its framework ops) states, checked."""
    if not isinstance(fields, Mapping):
        raise _fail("must be a mapping such as {query_mode: elementwise}", path, field_name)
    _check_keys(fields, _OP_MAPPING_KEYS, path, field_name)
    if "query_mode" in fields and fields["query_mode"] not in RUNTIME_QUERY_MODES:
        raise _fail(f"{fields['query_mode']!r} is not one of {RUNTIME_QUERY_MODES}", path, f"{field_name}.query_mode")
    if "tc_input_count" in fields and _integer(fields["tc_input_count"], path, f"{field_name}.tc_input_count") < 1:
        raise _fail("must be >= 1", path, f"{field_name}.tc_input_count")
    return dict(fields)


def _framework_ops(raw: Any, path: Path) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
    """framework_ops: op names, or {op: name, <runtime field>: value} where one op needs its own fields."""
    if raw is None:
        return (), {}
    if not isinstance(raw, list):
        raise _fail("must be a list of op names such as [aten.mm.default]", path, "framework_ops")
    names, fields = [], {}
    for index, entry in enumerate(raw):
        where = f"framework_ops[{index}]"
        if isinstance(entry, Mapping):
            name = entry.get("op")
            fields_of_op = _runtime_fields({k: v for k, v in entry.items() if k != "op"}, path, where)
        else:
            name, fields_of_op = entry, {}
        if not isinstance(name, str) or not _DOTTED_RE.match(name):
            raise _fail(f"{name!r} is not an op name such as aten.mm.default", path, where)
        names.append(name)
        if fields_of_op:
            fields[name] = fields_of_op
    return tuple(names), fields

def schema_op_for(kernel_type: str) -> str:
    """The op a torch trace's Type stands for: `mm` → `aten::mm`, `vllm.rms_norm` → `vllm::rms_norm`."""
    namespace, dot, name = kernel_type.partition(".")
    return f"{namespace}::{name}" if dot else f"aten::{kernel_type}"


def schema_definition(kernel_type: str, backends: Iterable[str] = BACKENDS,
                      schema_op: str | None = None) -> KernelDefinition:
    """The recipe of a Type no definition file covers: its op's schema builds every call (opperf.replay.schema).

    Outputs beyond the row's slots are ignored (the parse inferred the row's outputs from the same schema)."""
    schema_op = schema_op or schema_op_for(kernel_type)
    namespace, _, name = schema_op.partition("::")
    return KernelDefinition(type=kernel_type, backends=tuple(backends), category="schema",
                            api=f"torch.ops.{namespace}.{name}", path=Path(f"{SCHEMA_PREFIX}{schema_op}"),
                            hook=SCHEMA_HOOK, outputs=OutputSpec(verify=True, extra="ignore"), schema_op=schema_op)


def load_recipe(reference: str | Path, kernel_type: str) -> KernelDefinition:
    """A job's recipe by its reference: a definition file, or `schema:<ns>::<op>` (see KernelDefinition.reference)."""
    text = str(reference)
    if text.startswith(SCHEMA_PREFIX):
        return schema_definition(kernel_type, schema_op=text[len(SCHEMA_PREFIX):])
    return load_definition(text)


def load_definition(path: str | Path) -> KernelDefinition:
    """Load and validate one kernel definition file."""
    return parse_definition(read_yaml(path, "kernel definition"), path)


def definition_files(directory: str | Path) -> list[Path]:
    """Every `*.yaml` kernel definition under `directory` (recursively, sorted)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise OpperfError("kernel definitions directory not found", path=directory)
    return sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file())


def load_definitions(directory: str | Path = DEFAULT_DEFINITIONS_DIR,
                     backend: str | None = None) -> dict[str, KernelDefinition]:
    """Every kernel definition under `directory`, by its own Type; only those for `backend` if given.

    Type names (own and alternate) must be unique among the definitions of one back end, so a
    reported Type always has exactly one recipe.
    """
    if backend is not None and backend not in BACKENDS:
        raise OpperfError(f"unknown back end {backend!r} (expected one of {BACKENDS})")
    definitions: dict[str, KernelDefinition] = {}
    claimed: dict[tuple[str, str], Path] = {}
    for path in definition_files(directory):
        definition = load_definition(path)
        if backend is not None and not definition.supports(backend):
            continue
        for kernel_type in definition.kernel_types:
            for each in definition.backends:
                if (kernel_type, each) in claimed:
                    raise OpperfError(f"kernel type {kernel_type!r} on back end {each!r} is already defined in "
                                      f"{claimed[(kernel_type, each)]}", path=path, field="type")
                claimed[(kernel_type, each)] = path
        if definition.type in definitions:
            raise OpperfError(f"kernel type {definition.type!r} is already defined in "
                              f"{definitions[definition.type].path}", path=path, field="type")
        definitions[definition.type] = definition
    return definitions


def definition_for(definitions: Mapping[str, KernelDefinition], kernel_type: str,
                   backend: str | None = None) -> KernelDefinition | None:
    """The definition that replays `kernel_type` (directly or as an alternate), or None."""
    for definition in definitions.values():
        if kernel_type in definition.kernel_types and (backend is None or definition.supports(backend)):
            return definition
    return None


def definition_index(directory: str | Path = DEFAULT_DEFINITIONS_DIR,
                     backend: str | None = None) -> dict[str, Path]:
    """Reported Type (own and alternates) -> definition file, for Snakemake input functions."""
    index: dict[str, Path] = {}
    for definition in load_definitions(directory, backend).values():
        for kernel_type in definition.kernel_types:
            index.setdefault(kernel_type, definition.path)
    return index


def framework_op_mappings(definitions: Iterable[KernelDefinition]) -> list[dict[str, Any]]:
    """op_mapping.yaml's `operator_mappings` entries: framework op -> kernel type (+ alternates, category, api)."""
    mappings = []
    for definition in sorted(definitions, key=lambda d: d.type):
        for framework_op in definition.framework_ops:
            mappings.append({
                "framework_op": framework_op,
                "kernel_type": definition.type,
                "alternate_kernel_types": list(definition.alternate_kernel_types),
                "category": definition.category,
                "api": definition.api or f"{definition.hook}.build_case",
                **definition.op_mapping,
                **definition.framework_op_fields.get(framework_op, {}),
            })
    return mappings
