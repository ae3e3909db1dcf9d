"""How many observed Ascend kernel types the schema-driven replay (opperf.replay.schema) could replay with no
definition, judged offline against the torch_npu and vLLM-Ascend wheels' own schemas and meta kernels.

An NPU profile's row names a CANN kernel (`RmsNorm`, `GatherV2`, `MatMulV3`), not the framework op that launched
it, and records tensors only (no scalar arguments). So, per observed Type:

1. **op by name**: the Type's name, with CANN's variant suffixes dropped (`V2`, `AiCore`, `Custom`, `NdKernel` ...)
   and in snake case, looked up among the registered schemas: `aten::<name>`, `npu::npu_<name>`,
   `atb::npu_<name>`, `_C_ascend::<name>`, `vllm::<name>` (the step a definition's `api` does by hand);
2. **bind**: each row's tensor slots, in order, to the op's tensor arguments (trailing optional ones may be
   absent; every other argument must have a default, since NPU rows record no scalars);
3. **meta**: where the op has a meta kernel, the call on meta tensors must give the row's Output Shapes / Data
   Types (the replay's verifier).

Rows are the profiled rows of the real A3 profile where the Type has any, else the hand-made example rows of
tests/data/replay_npu/example_rows.csv (labelled). A Type counts as replayable with no definition when an op is
found and every checked row binds (and verifies where a meta kernel exists).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.definitions import schema_definition
from opperf.replay.inputs import MetaBuildContext
from opperf.replay.npu.offline_check import CheckRow, bind_problem
from opperf.replay.verify import verify_outputs

# CANN kernel-name decorations that say nothing of the op (variants, cores, implementations).
_SUFFIXES = ("AiCore", "Aicore", "WithImplMode", "NdKernel", "Kernel", "Custom", "BF16", "Common", "Nd", "Mix")
_VERSION = re.compile(r"V\d+$")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
NAMESPACE_PREFIXES = (("aten", ""), ("npu", "npu_"), ("atb", "npu_"), ("_C_ascend", ""), ("vllm", ""))

VERIFIED = "verified"              # op found; every row binds and reproduces its outputs on meta tensors
BOUND = "bound"                    # op found; every row binds (no meta kernel for some: shapes unchecked)
NOT_BOUND = "not_bound"            # op found, but a row's tensors do not fit its schema / outputs differ
NO_ROWS = "op_found_no_rows"       # op found; no row of this Type to check it with
NO_OP = "no_op"                    # no registered schema by that name


def name_candidates(kernel_type: str) -> list[str]:
    """`AddRmsNormDynamicQuantAiCore` → ['add_rms_norm_dynamic_quant', 'addrmsnormdynamicquant']."""
    name = re.sub(r"_\d+$", "", kernel_type)
    changed = True
    while changed:
        changed = False
        for suffix in _SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, changed = name[:-len(suffix)], True
        if _VERSION.search(name):
            name, changed = _VERSION.sub("", name), True
    name = name.removesuffix("_kernel").strip("_")
    snake = _CAMEL.sub("_", name).lower()
    return list(dict.fromkeys([snake, snake.replace("_", "")]))


def find_ops(kernel_type: str, defined: Mapping[str, set[str]]) -> list[str]:
    """Registered ops whose name matches the Type (namespaces in NAMESPACE_PREFIXES order)."""
    found = []
    for name in name_candidates(kernel_type):
        for namespace, prefix in NAMESPACE_PREFIXES:
            op = prefix + name
            if namespace == "aten":
                if hasattr(torch.ops.aten, op):
                    found.append(f"aten::{op}")
            elif op in defined.get(namespace, set()):
                found.append(f"{namespace}::{op}")
    return list(dict.fromkeys(found))


def _tensor_type(type_text: str) -> bool:
    return type_text in ("Tensor", "Optional[Tensor]")


_SCALAR_TYPES = ("Scalar", "number", "float", "Optional[Scalar]", "Optional[float]")


def _npu_arguments(schema, ctx: MetaBuildContext, count: int) -> dict:
    """The row's slots, in order, as the schema's arguments: a slot to each tensor argument, and to a Scalar
    argument where the slot is a 0-d or one-element tensor (CANN kernels take scalars as tensors); every other
    argument keeps its default."""
    values, cursor = {}, 0
    for argument in schema.arguments:
        if cursor >= count:
            break
        type_text = str(argument.real_type)
        shape = ctx.input_shape(cursor)
        if _tensor_type(type_text):
            values[argument.name] = ctx.tensor(shape, ctx.input_dtype(cursor)) if shape is not None else None
            cursor += 1
        elif type_text in _SCALAR_TYPES and (shape is None or math.prod(shape) <= 1):
            values[argument.name] = 1.0 if "float" in type_text else 1
            cursor += 1
    if cursor < count:
        raise ValueError(f"{count - cursor} of the row's {count} slots have no tensor or scalar argument left")
    return values


def bind_npu_row(op_name: str, row: Mapping[str, str]) -> tuple[str, str]:
    """(status, detail) of one row against every overload of `op_name` (see the module docstring, steps 2-3)."""
    namespace, _, name = op_name.partition("::")
    packet = getattr(getattr(torch.ops, namespace), name)
    ctx = MetaBuildContext(schema_definition(name, ("npu",), schema_op=op_name), row, "meta")
    count = max(len(ctx.slots.input_shapes), len(ctx.slots.input_dtypes))
    problems = []
    for overload_name in sorted(packet.overloads(), key=lambda o: (o != "default", o)):
        overload = getattr(packet, overload_name)
        try:
            kwargs = _npu_arguments(overload._schema, ctx, count)
        except (ValueError, OpperfError) as exc:
            problems.append(f"{overload_name}: {exc}")
            continue
        problem = bind_problem(overload._schema, (), kwargs)
        if problem:
            problems.append(f"{overload_name}: {problem}")
            continue
        try:
            produced = overload(**kwargs)
        except NotImplementedError:
            return BOUND, f"{op_name}.{overload_name} (no meta kernel)"
        except Exception as exc:  # noqa: BLE001 — a meta kernel that refuses these shapes
            problems.append(f"{overload_name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}"
                            if str(exc).strip() else f"{overload_name}: {type(exc).__name__}")
            continue
        verdict = verify_outputs(row, ctx.slots, produced, schema_definition(name, ("npu",)).outputs)
        if verdict.ok:
            return VERIFIED, f"{op_name}.{overload_name}"
        problems.append(f"{overload_name}: {verdict.message}")
    return NOT_BOUND, "; ".join(problems)[:300]


@dataclass
class TypeCoverage:
    kernel_type: str
    ops: list[str]
    status: str
    rows: int = 0
    source: str = ""                  # profiled | example
    has_definition: bool = False
    details: list[str] = field(default_factory=list)


def type_coverage(kernel_type: str, rows: Iterable[CheckRow], defined: Mapping[str, set[str]],
                  has_definition: bool) -> TypeCoverage:
    rows = list(rows)
    profiled = [r for r in rows if r.source == "profiled"]
    checked = profiled or rows
    ops = find_ops(kernel_type, defined)
    result = TypeCoverage(kernel_type, ops, NO_OP, rows=len(checked),
                          source=checked[0].source if checked else "", has_definition=has_definition)
    if not ops:
        return result
    if not checked:
        result.status = NO_ROWS
        return result
    for op in ops:                                 # the first op every row binds to
        outcomes = [bind_npu_row(op, r.fields) for r in checked]
        statuses = {s for s, _ in outcomes}
        if NOT_BOUND not in statuses:
            result.status = VERIFIED if statuses == {VERIFIED} else BOUND
            result.ops, result.details = [op], sorted({d for _, d in outcomes})
            return result
        result.details += [f"{op}: {d}" for s, d in outcomes if s == NOT_BOUND][:2]
    result.status = NOT_BOUND
    return result


def summarise(coverages: Iterable[TypeCoverage]) -> dict:
    coverages = list(coverages)
    counts = {status: sum(c.status == status for c in coverages) for status in (VERIFIED, BOUND, NOT_BOUND,
                                                                                NO_ROWS, NO_OP)}
    return {"types": len(coverages), **counts,
            "replayable_without_definition": counts[VERIFIED] + counts[BOUND],
            "of_which_verified_on_meta": counts[VERIFIED],
            "with_definition": sum(c.has_definition for c in coverages),
            "replayable_and_without_definition_today": sum(c.status in (VERIFIED, BOUND) and not c.has_definition
                                                           for c in coverages)}


def rows_by_type(rows: Iterable[CheckRow]) -> dict[str, list[CheckRow]]:
    grouped: dict[str, list[CheckRow]] = {}
    for check_row in rows:
        grouped.setdefault(contract.normalise_kernel_type(check_row.kernel_type), []).append(check_row)
    return grouped
