"""vLLM-Ascend's custom-op schemas, read out of its wheel (a zip) on a machine with no NPU: no import, no CANN.

Two namespaces of ops our NPU definitions call live in the vllm-ascend wheel, not in torch_npu's:

- `torch.ops._C_ascend.*` (`npu_add_rms_norm_bias`, `dispatch_ffn_combine`, `npu_apply_top_k_top_p`, ...):
  their schemas are the literal strings `vllm_ascend_C*.so` registers (`ops.def("...")`), read from the binary
  as text; their meta kernels are C++ (`torch_binding_meta.cpp`), so these ops are bound, not run.
- `torch.ops.vllm.*` (`qkv_rmsnorm_rope`, `muls_add`, ...): registered from Python with
  `direct_register_custom_op(op_name=, op_func=, fake_impl=, mutates_args=)`. Like vLLM does at import, the
  schema is inferred from `op_func`'s signature (`torch.library.infer_schema`) and `fake_impl` becomes the
  meta kernel. Only the two function definitions are executed (signature-only for `op_func`, whose body
  launches Triton); a fake that needs more than torch fails at call time and is reported so.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from opperf.replay.npu.torch_npu_wheel import download_wheel, open_wheel

_C_ASCEND_SCHEMA_RE = re.compile(rb"([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)?\((?:Tensor|int|str|float|bool|SymInt)"
                                 rb"[\x09\x0a\x20-\x7e]*?\)\s*->\s*[\x09\x0a\x20-\x7e]+?)\x00")


@dataclass
class PythonOp:
    """One `direct_register_custom_op` of the wheel: the op's name, its signature function and fake (source)."""

    name: str
    file: str
    signature_source: str            # `def op_func(...) -> ...: pass`
    fake_source: str | None          # the fake's full definition (or a lambda expression)
    function_name: str
    fake_name: str | None
    mutates_args: tuple[str, ...] = ()


@dataclass
class VllmAscendContents:
    version: str
    path: Path
    c_ascend_schemas: list[str]
    python_ops: list[PythonOp] = field(default_factory=list)


def find_or_download_wheel(version: str, cache_dir: str | Path) -> Path:
    """The vllm-ascend wheel of `version` in `cache_dir`, downloaded if absent."""
    return download_wheel("vllm-ascend", version, cache_dir)


def _module_functions(source: str) -> tuple[ast.Module | None, dict[str, ast.FunctionDef]]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None, {}
    return tree, {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


def _python_ops(name: str, tree: ast.Module, local: dict[str, ast.FunctionDef],
                everywhere: dict[str, ast.FunctionDef]) -> list[PythonOp]:
    """The file's direct_register_custom_op calls; op_func / fake_impl found in the file, else in the wheel
    (`register_custom_ops.py` imports `muls_add_triton` from `ops/triton/muls_add.py`)."""
    functions = {**everywhere, **local}
    ops = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "direct_register_custom_op"):
            continue
        keywords = {k.arg: k.value for k in node.keywords}
        op_name, op_func = keywords.get("op_name"), keywords.get("op_func")
        if not (isinstance(op_name, ast.Constant) and isinstance(op_func, ast.Name) and op_func.id in functions):
            continue
        definition = functions[op_func.id]
        stub = ast.FunctionDef(name=definition.name, args=definition.args, body=[ast.Pass()], decorator_list=[],
                               returns=definition.returns, type_params=[])
        fake = keywords.get("fake_impl")
        fake_source = fake_name = None
        if isinstance(fake, ast.Name) and fake.id in functions:
            fake_source, fake_name = ast.unparse(functions[fake.id]), fake.id
        elif isinstance(fake, ast.Lambda):
            fake_source, fake_name = f"_fake = {ast.unparse(fake)}", "_fake"
        try:
            mutates = tuple(ast.literal_eval(keywords["mutates_args"])) if "mutates_args" in keywords else ()
        except ValueError:
            mutates = ()
        ops.append(PythonOp(op_name.value, name, ast.unparse(ast.fix_missing_locations(stub)), fake_source,
                            definition.name, fake_name, mutates))
    return ops


def read_wheel(path: str | Path) -> VllmAscendContents:
    path = Path(path)
    archive, match = open_wheel(path, "vllm_ascend")
    schemas: list[str] = []
    python_ops: list[PythonOp] = []
    modules: dict[str, tuple[ast.Module | None, dict[str, ast.FunctionDef]]] = {}
    with archive:
        for name in archive.namelist():
            if re.match(r"vllm_ascend/vllm_ascend_C.*\.so$", name):
                for found in _C_ASCEND_SCHEMA_RE.finditer(archive.read(name)):
                    schemas.append(re.sub(r"\s+", " ", found.group(1).decode("ascii")).strip())
            elif name.endswith(".py"):
                modules[name] = _module_functions(archive.read(name).decode("utf-8", errors="replace"))
    everywhere: dict[str, ast.FunctionDef] = {}
    for _, functions in modules.values():
        for function_name, node in functions.items():
            everywhere.setdefault(function_name, node)
    for name, (tree, functions) in modules.items():
        if tree is not None and any(getattr(getattr(n, "func", None), "id", None) == "direct_register_custom_op"
                                    for n in ast.walk(tree)):
            python_ops += _python_ops(name, tree, functions, everywhere)
    return VllmAscendContents(version=match.group(1) if match else "?", path=path,
                              c_ascend_schemas=list(dict.fromkeys(schemas)), python_ops=python_ops)


def register_wheel(contents: VllmAscendContents) -> dict[str, set[str]]:
    """Define `_C_ascend` schemas and the `vllm` Python ops (fake as Meta); returns namespace -> op names."""
    import torch

    defined: dict[str, set[str]] = {"_C_ascend": set(), "vllm": set()}
    c_ascend = torch.library.Library("_C_ascend", "FRAGMENT")
    _LIBRARIES.append(c_ascend)
    for schema in contents.c_ascend_schemas:
        try:
            c_ascend.define(_alias_sets(schema))
        except RuntimeError:
            continue
        defined["_C_ascend"].add(schema.split("(", 1)[0].split(".", 1)[0])
    vllm = torch.library.Library("vllm", "FRAGMENT")
    _LIBRARIES.append(vllm)
    for op in contents.python_ops:
        namespace: dict = {"torch": torch}
        try:
            exec(compile("from __future__ import annotations\nimport torch\n" + op.signature_source, op.file,
                         "exec"), namespace)                      # noqa: S102 - a signature, no body
            signature = namespace[op.function_name]
            signature.__annotations__ = {k: eval(v, namespace) if isinstance(v, str) else v   # noqa: S307
                                         for k, v in signature.__annotations__.items()}
            vllm.define(op.name + torch.library.infer_schema(signature, mutates_args=op.mutates_args))
        except Exception:                                          # noqa: BLE001 - a signature torch cannot type
            continue
        defined["vllm"].add(op.name)
        if op.fake_source:
            try:
                exec(compile("import torch\n" + op.fake_source, op.file, "exec"), namespace)   # noqa: S102
                vllm.impl(op.name, namespace[op.fake_name], "Meta")
            except Exception:                                      # noqa: BLE001 - bound only, reported as such
                pass
    return defined


_LIBRARIES: list = []


def _alias_sets(schema: str) -> str:
    """`Tensor!` (the old mutable spelling vLLM-Ascend's schemas use) as `Tensor(a!)`, `Tensor(b!)`, ..."""
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    return re.sub(r"Tensor!", lambda _: f"Tensor({next(letters)}!)", schema)
