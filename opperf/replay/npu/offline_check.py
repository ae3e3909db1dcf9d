"""Check the NPU kernel definitions against torch_npu itself, on any machine: schema binding and meta shapes.

For every NPU definition and every row (profiled rows of real profiles; example rows, labelled as such):

1. the call the definition builds from the row (the same builder the replay uses: declarative slots or the
   hook's `build_call`, with every tensor a meta tensor) is **bound** to the schema of the op it calls, as the
   torch_npu wheel defines it (every argument exists, each value fits its declared type, nothing required is
   missing; for `torch.*` APIs, torch's own aten schemas bind the call instead);
2. where the op has a meta kernel (torch_npu's `_meta_registrations.py`, or aten's for `torch.*` APIs), the
   call **runs** on meta tensors and its outputs (after the definition's own output mapping) are compared
   with the row's `Output Shapes` / `Output Data Types` by the replay's own verifier.

vLLM-Ascend custom ops (`torch.ops._C_ascend.*`, `torch.ops.vllm.*`) have no schema in the torch_npu wheel:
they are reported `no_schema`, never counted as bound. See docs/replay_npu.md for what this proves and what not.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.definitions import KernelDefinition, definition_for
from opperf.replay.inputs import MetaBuildContext, declarative_arguments, row_layout
from opperf.replay.npu.torch_npu_wheel import Registration
from opperf.replay.verify import verify_outputs

# Outcomes of one (definition, row) check.
SHAPE_VERIFIED = "shape_verified"        # bound, ran on meta, outputs equal the row's
BOUND = "bound"                          # bound; the op has no meta kernel, so shapes are not checked
MISMATCH = "mismatch"                    # bound and ran, outputs differ from the row's
BIND_ERROR = "bind_error"                # the call does not fit the op's schema
BUILD_ERROR = "build_error"              # the definition could not build a call from the row
META_ERROR = "meta_error"                # the meta kernel rejected the call (a torch._check failed)
NO_SCHEMA = "no_schema"                  # the op is not in the torch_npu wheel (vLLM-Ascend custom op)
FAILURES = (MISMATCH, BIND_ERROR, BUILD_ERROR, META_ERROR)


@dataclass
class BuiltCall:
    api: str
    args: tuple
    kwargs: dict
    outputs: Any = None          # NpuCall.outputs: maps the API's result to the kernel's output slots


def build_meta_call(definition: KernelDefinition, row: Mapping[str, str], *, path=None, line=None) -> BuiltCall:
    """The call the replay would make for `row`, with meta tensors (the replay's own builders)."""
    ctx = MetaBuildContext(definition, row, "meta", path=path, line=line)
    if definition.hook:
        module = importlib.import_module(definition.hook)
        builder = getattr(module, "build_call", None)
        if builder is None:
            raise OpperfError(f"hook {definition.hook} has no build_call(row, ctx)", path=definition.path,
                              field="hook")
        call = builder(row, ctx)
        return BuiltCall(call.api, tuple(call.args), dict(call.kwargs), call.outputs)
    args, kwargs, _ = declarative_arguments(definition, ctx)
    return BuiltCall(row_layout(definition, ctx).api, tuple(args), kwargs)


# --- schema binding -----------------------------------------------------------------------------------------

def _fits(type_text: str, value: Any) -> bool:
    """Whether a Python value fits a schema argument type (`Optional[List[int]]`, `Tensor`, `ScalarType`, ...)."""
    if type_text.startswith("Optional["):
        return value is None or _fits(type_text[len("Optional["):-1], value)
    if type_text.startswith("List["):
        inner = type_text[len("List["):-1]
        if inner in ("int", "SymInt", "float") and _fits(inner, value):
            return True             # int[2] / float[] accept one number
        return isinstance(value, (list, tuple)) and all(_fits(inner, v) for v in value)
    if type_text == "Tensor":
        return isinstance(value, torch.Tensor)
    if type_text in ("int", "SymInt"):
        return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)
    if type_text == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if type_text == "bool":
        return isinstance(value, bool)
    if type_text == "str":
        return isinstance(value, str)
    if type_text == "number":
        return isinstance(value, (int, float, complex, bool))
    if type_text == "ScalarType":
        return isinstance(value, torch.dtype)
    if type_text == "Device":
        return isinstance(value, (torch.device, str))
    if type_text == "Layout":
        return isinstance(value, torch.layout)
    if type_text == "MemoryFormat":
        return isinstance(value, torch.memory_format)
    return True                      # types the definitions never pass (Generator, Dimname, ...)


def bind_problem(schema, args: tuple, kwargs: Mapping[str, Any]) -> str | None:
    """Why `args`/`kwargs` do not bind to `schema` (a torch FunctionSchema), or None when they do."""
    arguments = list(schema.arguments)
    positional = [a for a in arguments if not a.kwarg_only]
    if len(args) > len(positional):
        return f"{len(args)} positional arguments, the schema takes {len(positional)}"
    given = {a.name: v for a, v in zip(positional, args)}
    names = {a.name for a in arguments}
    for key, value in kwargs.items():
        if key not in names:
            return f"no argument named {key!r}"
        if key in given:
            return f"argument {key!r} given twice"
        given[key] = value
    for argument in arguments:
        if argument.name not in given:
            if not argument.has_default_value():
                return f"required argument {argument.name!r} ({argument.real_type}) missing"
            continue
        value = given[argument.name]
        if not _fits(str(argument.real_type), value):
            shown = type(value).__name__ if not isinstance(value, torch.Tensor) else "Tensor"
            return f"argument {argument.name!r} expects {argument.real_type}, got {shown}"
    return None


@dataclass(frozen=True)
class Target:
    """The op a call resolves to: a torch_npu namespace op (`npu::npu_rms_norm`), an aten callable, or neither."""

    kind: str                        # torch_npu | aten | no_schema
    name: str                        # qualified op name (`npu::npu_rms_norm`) or the dotted API
    packet: Any = None               # torch.ops packet (torch_npu) or the callable (aten)


def resolve_target(api: str, registration: Registration) -> Target:
    parts = api.split(".")
    namespace = name = None
    if api.startswith("torch_npu.atb.") and len(parts) == 3:
        namespace, name = "atb", parts[2]
    elif api.startswith("torch_npu.") and len(parts) == 2:
        name = parts[1]
        namespace = "npu" if name in registration.defined["npu"] else "atb"
    elif api.startswith("torch.ops.") and len(parts) >= 4 and parts[2] != "aten":
        namespace, name = parts[2], parts[3]     # npu / atb (torch_npu), _C_ascend / vllm (vLLM-Ascend)
    if namespace is not None:
        if name not in registration.defined.get(namespace, set()):
            return Target("no_schema", f"{namespace}::{name}")
        return Target("torch_npu", f"{namespace}::{name}", getattr(getattr(torch.ops, namespace), name))
    from opperf.replay.inputs import resolve_callable
    return Target("aten", api, resolve_callable(api))


# --- one row, many rows -------------------------------------------------------------------------------------

@dataclass
class RowCheck:
    kernel_type: str                 # the row's Type
    definition: str                  # the definition's own Type
    origin: str                      # file:line
    source: str                      # profiled | example
    target: str
    status: str
    reason: str = ""


def _has_meta_kernel(target: Target, overload: str) -> bool:
    qualified = target.name if overload == "default" else f"{target.name}.{overload}"
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Meta")


def check_row(definition: KernelDefinition, row: Mapping[str, str], registration: Registration, *,
              kernel_type: str, origin: str, source: str, path=None, line=None) -> RowCheck:
    """Build, bind and (where a meta kernel exists) run one row's call; compare outputs with the row."""
    result = RowCheck(kernel_type, definition.type, origin, source, target="", status=BUILD_ERROR)
    try:
        call = build_meta_call(definition, row, path=path, line=line)
    except (OpperfError, ValueError, RuntimeError, TypeError) as exc:
        result.reason = str(exc)
        return result
    target = resolve_target(call.api, registration)
    result.target = target.name
    if target.kind == "no_schema":
        result.status = NO_SCHEMA
        result.reason = f"{call.api} is defined by neither the torch_npu nor the vllm-ascend wheel"
        return result
    if target.kind == "torch_npu":
        problems = {}
        for overload in target.packet.overloads():
            problem = bind_problem(getattr(target.packet, overload)._schema, call.args, call.kwargs)
            if problem is None:
                break
            problems[overload] = problem
        else:
            result.status = BIND_ERROR
            result.reason = "; ".join(f"{target.name}.{o}: {p}" for o, p in problems.items())
            return result
        result.target = f"{target.name}.{overload}"
        if not _has_meta_kernel(target, overload):
            result.status, result.reason = BOUND, "no Python meta kernel for this op in the wheels"
            return result
        function = getattr(target.packet, overload)
    else:
        function = target.packet
    try:
        produced = function(*call.args, **call.kwargs)
        if call.outputs is not None:
            produced = call.outputs(produced)
    except TypeError as exc:
        if target.kind == "aten":     # aten's Python binding rejects the arguments
            result.status, result.reason = BIND_ERROR, str(exc).splitlines()[0]
        else:                         # the call bound; torch_npu's meta kernel returned what its schema does not
            result.status = BOUND
            result.reason = f"torch_npu's meta kernel disagrees with its own schema ({str(exc).splitlines()[0]})"
        return result
    except (RuntimeError, ValueError, IndexError, NotImplementedError) as exc:
        result.status, result.reason = META_ERROR, str(exc).strip().splitlines()[0][:300]
        return result
    slots = MetaBuildContext(definition, row, "meta", path=path, line=line).slots
    verdict = verify_outputs(row, slots, produced, definition.outputs)
    if verdict.ok:
        result.status = SHAPE_VERIFIED
        result.reason = f"{verdict.produced}"
    else:
        result.status, result.reason = MISMATCH, verdict.message
    return result


@dataclass
class CheckRow:
    """A row to check: its fields, Type, where it came from and whether it was profiled or is an example."""

    kernel_type: str
    fields: dict[str, str]
    origin: str
    source: str
    path: Path | None = None
    line: int | None = None


def profiled_rows(paths: Iterable[str | Path]) -> list[CheckRow]:
    """Distinct rows (by Type and signature) of real profiler tables, through opperf's own parser."""
    from opperf.parse.discover import discover_inputs
    from opperf.parse.kernel_details import read_profile_table

    rows: list[CheckRow] = []
    seen: set = set()
    for table_path in discover_inputs([Path(p) for p in paths]).tables:
        table = read_profile_table(table_path)
        frame = table.frame
        for index, record in enumerate(frame.iter_rows(named=True)):
            kernel_type = contract.normalise_kernel_type(str(record.get("Type") or ""))
            if not kernel_type or kernel_type.startswith("hcom_"):
                continue
            fields = {c: str(record.get(c) or "") for c in contract.BASE_COLUMNS}
            key = (kernel_type, contract.row_signature(fields))
            if key in seen:
                continue
            seen.add(key)
            line = table.locate(index)
            rows.append(CheckRow(kernel_type, fields, f"{table_path}:{line}", "profiled", table_path, line))
    return rows


def example_rows(path: str | Path) -> list[CheckRow]:
    """Example rows (`Type` + base columns per line): hand-made shapes, reported apart from profiled rows."""
    import csv

    path = Path(path)
    with open(path, newline="", encoding="utf-8") as handle:
        return [CheckRow(row["Type"], dict(row), f"{path}:{number}", "example", path, number)
                for number, row in enumerate(csv.DictReader(handle), start=2)]


@dataclass
class TypeSummary:
    definition: str
    target: str = ""
    rows: Counter = field(default_factory=Counter)          # source -> rows checked
    statuses: Counter = field(default_factory=Counter)      # (source, status) -> rows
    reasons: list[str] = field(default_factory=list)        # failures, one line each

    def count(self, status: str, source: str | None = None) -> int:
        return sum(n for (s, st), n in self.statuses.items() if st == status and (source is None or s == source))


def run_check(definitions: Mapping[str, KernelDefinition], rows: Iterable[CheckRow],
              registration: Registration) -> tuple[dict[str, TypeSummary], list[RowCheck]]:
    """Check every row whose Type has an NPU definition; per definition a summary, plus every row's result."""
    summaries = {name: TypeSummary(name) for name in sorted(definitions)}
    results = []
    for row in rows:
        definition = definition_for(definitions, row.kernel_type, "npu")
        if definition is None:
            continue
        check = check_row(definition, row.fields, registration, kernel_type=row.kernel_type, origin=row.origin,
                          source=row.source, path=row.path, line=row.line)
        results.append(check)
        summary = summaries[definition.type]
        summary.target = summary.target or check.target
        summary.rows[row.source] += 1
        summary.statuses[(row.source, check.status)] += 1
        if check.status in FAILURES or check.status == NO_SCHEMA:
            summary.reasons.append(f"{check.origin} [{check.status}] {check.reason}")
    return summaries, results


def format_table(summaries: Mapping[str, TypeSummary], version: str) -> str:
    """The per-definition table (markdown), the numbers the docs quote."""
    lines = [f"torch_npu {version}: per NPU definition, rows bound to the schema / shape-verified on meta tensors",
             "",
             "| definition | op | profiled rows: bound / shape-verified / failed | example rows: bound / "
             "shape-verified / failed | status |",
             "|---|---|---|---|---|"]
    for name, summary in summaries.items():
        cells = []
        for source in ("profiled", "example"):
            total = summary.rows[source]
            if not total:
                cells.append("-")
                continue
            verified = summary.count(SHAPE_VERIFIED, source)
            bound = verified + summary.count(BOUND, source) + summary.count(MISMATCH, source) \
                + summary.count(META_ERROR, source)
            failed = sum(summary.count(s, source) for s in FAILURES)
            cells.append(f"{bound}/{total} / {verified}/{total} / {failed}")
        inconsistent = summary.count(BUILD_ERROR, "profiled")
        blocking = sum(summary.count(s) for s in FAILURES) - inconsistent
        if summary.count(NO_SCHEMA):
            status = "no schema offline"
        elif blocking:
            status = "FAILED"
        elif summary.count(SHAPE_VERIFIED):
            status = "shape-verified" + (f" ({inconsistent} profiled rows unbuildable, see below)" if inconsistent
                                         else "")
        elif summary.count(BOUND):
            status = "schema-bound (no meta kernel)"
        else:
            status = "no rows"
        lines.append(f"| {name} | `{summary.target or '-'}` | {cells[0]} | {cells[1]} | {status} |")
    return "\n".join(lines) + "\n"


def torch_npu_version_for(version_dir: str) -> str:
    """The torch_npu release of a version directory's stack: torch_npu versions follow torch's (2.9.0 -> 2.9.0)."""
    from opperf.versions import parse_version_dir

    return parse_version_dir(version_dir).torch


def vllm_ascend_version_for(version_dir: str) -> str | None:
    """The vLLM-Ascend release of a version directory (vllm0.18.0_... -> 0.18.0); None without a vllm part."""
    from opperf.versions import parse_version_dir

    return parse_version_dir(version_dir).vllm or None


def blocking_failures(results: Iterable[RowCheck]) -> list[RowCheck]:
    """Results that fail the check: everything in FAILURES except a profiled row the builder refused by name.

    A profiled row whose shapes no configuration of its API can produce (the real fixture's MatMul row with
    K=8192 against an 81920-row operand) is data, not a definition bug: the replay records it `failed_build`
    with the same reason, and the table lists it.
    """
    return [r for r in results if r.status in FAILURES and not (r.status == BUILD_ERROR and r.source == "profiled")]


def run_offline_check(torch_npu_version: str, wheel_cache: str | Path, profiles: Iterable[str | Path],
                      examples: Iterable[str | Path], definitions_dir: str | Path, output: str | Path,
                      cann_version: str = "8.5", vllm_ascend_version: str | None = None,
                      kernel_types: Iterable[str] | None = None) -> tuple[dict[str, TypeSummary], list[RowCheck]]:
    """Download (or reuse) the wheels, register them, check every row, write the table and every failure."""
    from opperf.io import atomic_output
    from opperf.replay.definitions import load_definitions
    from opperf.replay.npu import vllm_ascend_wheel
    from opperf.replay.npu.torch_npu_wheel import find_or_download_wheel, read_wheel, register_wheel

    contents = read_wheel(find_or_download_wheel(torch_npu_version, wheel_cache))
    registration = register_wheel(contents, cann_version=cann_version)
    vllm_note = "vLLM-Ascend custom ops: no vllm-ascend version given, not bound."
    if vllm_ascend_version:
        try:
            vllm_contents = vllm_ascend_wheel.read_wheel(
                vllm_ascend_wheel.find_or_download_wheel(vllm_ascend_version, wheel_cache))
        except OpperfError as exc:
            vllm_note = f"vLLM-Ascend custom ops not bound: {exc}"
        else:
            registration.defined.update(vllm_ascend_wheel.register_wheel(vllm_contents))
            vllm_note = (f"vLLM-Ascend custom ops from {vllm_contents.path.name}: "
                         f"{len(registration.defined['_C_ascend'])} `_C_ascend` schemas (bound only: their meta "
                         f"kernels are C++), {len(registration.defined['vllm'])} `vllm` Python ops (schema inferred "
                         "from op_func, fake_impl as the meta kernel).")
    definitions = load_definitions(definitions_dir, backend="npu")
    rows = profiled_rows(list(profiles)) if profiles else []
    for path in examples:
        rows += example_rows(path)
    skipped: list[str] = []
    if kernel_types is not None:
        # One stack's check covers the Types its deployments report (and those its profiles hold): a kernel
        # type the stack never launches need not bind to that stack's schemas.
        wanted = set(kernel_types) | {r.kernel_type for r in rows if r.source == "profiled"}
        skipped = sorted(name for name, d in definitions.items() if not wanted & set(d.kernel_types))
        definitions = {name: d for name, d in definitions.items() if name not in skipped}
    summaries, results = run_check(definitions, rows, registration)
    text = [format_table(summaries, contents.version), "",
            f"Schemas: {sum(len(v) for v in registration.defined.values())} ops defined from {contents.path.name} "
            f"({len(registration.rejected)} schema strings torch {torch.__version__} refused); meta kernels from "
            f"{', '.join(registration.meta_files)}.", vllm_note,
            f"Definitions not checked (their Types are not observed in this stack): {', '.join(skipped) or 'none'}.",
            "", "Rows that did not verify:"]
    text += [f"- {r.kernel_type} {r.origin} [{r.status}] {r.reason}" for r in results
             if r.status not in (SHAPE_VERIFIED,)]
    with atomic_output(output) as handle:
        handle.write("\n".join(text) + "\n")
    return summaries, results
