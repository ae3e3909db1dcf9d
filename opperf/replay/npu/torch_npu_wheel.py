"""torch_npu's own op schemas and meta kernels, read out of its wheel on a machine with no NPU and no CANN.

The wheel (`pip download --no-deps torch-npu==X`, ~27 MB, from the package index) is a zip. Three of its
files describe the ops our NPU definitions call:

- `torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`: every `func:` schema of the `npu` namespace
  (`npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)`, ...);
- `torch_npu/lib/libop_plugin_atb.so`: the `atb` namespace's schemas (`npu_ring_mla`,
  `_npu_reshape_and_cache`, ...), as the literal strings its TORCH_LIBRARY block registers;
- `torch_npu/op_plugin/meta/_meta_registrations.py` (+ `atb/_atb_meta_registrations.py`): Python meta kernels
  (output shapes and dtypes from input shapes) for ~150 ops.

`register_wheel` defines the schemas in torch.library fragments of the running (CPU) torch and executes the
meta files' source with stand-ins for the only three torch_npu names they import (`ErrCode`, `ops_error`,
`npu.utils._is_gte_cann_version`): nothing else of torch_npu is imported, no CANN library is loaded. The
schemas and the meta kernels are torch_npu's own text; the stand-ins only format error messages and answer
the CANN-version question for the stack being checked. Registration is process-wide, so one process checks
one torch_npu version (the CLI runs one version per call).
"""

from __future__ import annotations

import re
import subprocess
import sys
import types
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from opperf.errors import OpperfError

SCHEMA_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
ATB_LIBRARY = "torch_npu/lib/libop_plugin_atb.so"
META_FILES = ("torch_npu/op_plugin/meta/_meta_registrations.py", "torch_npu/op_plugin/atb/_atb_meta_registrations.py")
# The wheel's content does not depend on the Python version it was built for; this one exists for every release
# we support, so any host downloads the same file.
WHEEL_PLATFORM = ("--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_24_x86_64",
                  "--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
                  "--abi", "cp311", "--only-binary=:all:")
_ATB_SCHEMA_RE = re.compile(rb"(_?npu_[a-z0-9_]+(?:\.[a-z0-9_]+)?\((?:Tensor|int|str|float|bool|SymInt)[\x20-\x7e]*?"
                            rb"\)(?: -> [\x20-\x7e]+)?)\x00")


@dataclass
class WheelContents:
    """What the check needs from one torch_npu wheel."""

    version: str
    path: Path
    npu_schemas: list[str]                   # `func:` strings of the npu namespace
    atb_schemas: list[str]                   # schema strings of the atb namespace
    meta_sources: dict[str, str] = field(default_factory=dict)   # file name in the wheel -> Python source


def download_wheel(package: str, version: str, cache_dir: str | Path) -> Path:
    """The wheel of `package`=`version` in `cache_dir`, downloaded with pip (no dependencies) if absent."""
    cache_dir = Path(cache_dir)
    pattern = f"{package.replace('-', '_')}-{version}-*.whl"
    cached = sorted(cache_dir.glob(pattern))
    if cached:
        return cached[0]
    cache_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{package}=={version}",
               "-d", str(cache_dir), *WHEEL_PLATFORM]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=900)
    cached = sorted(cache_dir.glob(pattern))
    if completed.returncode != 0 or not cached:
        tail = (completed.stderr or completed.stdout).strip().splitlines()[-1:] or ["no wheel written"]
        raise OpperfError(f"cannot download {package}=={version} with pip ({tail[0]}); put the wheel there by hand",
                          path=cache_dir)
    return cached[0]


def find_or_download_wheel(version: str, cache_dir: str | Path) -> Path:
    """The torch_npu wheel of `version` in `cache_dir`, downloaded if absent."""
    return download_wheel("torch-npu", version, cache_dir)


def _yaml_schemas(text: str, path: Path) -> list[str]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OpperfError(f"{SCHEMA_YAML} is not valid YAML: {exc}", path=path) from exc
    schemas = []
    for section in document.values() if isinstance(document, dict) else ():
        for entry in section if isinstance(section, list) else ():
            if isinstance(entry, dict) and isinstance(entry.get("func"), str) and "(" in entry["func"]:
                schemas.append(entry["func"])
    return schemas


def open_wheel(path: Path, distribution: str) -> tuple[zipfile.ZipFile, re.Match | None]:
    """A wheel opened as the zip it is, and the match of its `<distribution>-<version>-` file name."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise OpperfError(f"not a readable wheel: {exc}", path=path) from exc
    return archive, re.match(rf"{distribution}-([^-]+)-", path.name)


def read_wheel(path: str | Path) -> WheelContents:
    """Schemas and meta-kernel sources of a torch_npu wheel (a zip; nothing is installed or imported)."""
    path = Path(path)
    archive, match = open_wheel(path, "torch_npu")
    with archive:
        names = set(archive.namelist())
        if SCHEMA_YAML not in names:
            raise OpperfError(f"the wheel has no {SCHEMA_YAML}", path=path)
        npu_schemas = _yaml_schemas(archive.read(SCHEMA_YAML).decode("utf-8"), path)
        atb_schemas = []
        if ATB_LIBRARY in names:
            atb_schemas = list(dict.fromkeys(m.group(1).decode("ascii")
                                             for m in _ATB_SCHEMA_RE.finditer(archive.read(ATB_LIBRARY))))
        meta_sources = {name: archive.read(name).decode("utf-8") for name in META_FILES if name in names}
    return WheelContents(version=match.group(1) if match else "?", path=path, npu_schemas=npu_schemas,
                         atb_schemas=atb_schemas, meta_sources=meta_sources)


@dataclass
class Registration:
    """What `register_wheel` defined: per namespace the op names, and which schemas could not be defined."""

    defined: dict[str, set[str]]             # namespace -> op names (without overload)
    rejected: list[tuple[str, str]]          # (schema, why torch refused it)
    meta_files: list[str]                    # meta sources that executed
    libraries: list = field(default_factory=list)   # keep the torch.library objects alive


_REGISTERED: dict[str, Registration] = {}


def _stand_in_modules(cann_version: str) -> dict[str, types.ModuleType]:
    """The torch_npu names the meta files import, and nothing more (see the module docstring)."""
    error_code = types.ModuleType("torch_npu.utils._error_code")

    class ErrCode:            # torch_npu's enum only feeds error-message suffixes
        def __getattr__(self, name: str) -> str:
            return name

    error_code.ErrCode = ErrCode()
    error_code.ops_error = lambda code, *args, **kwargs: f" [ERR {code}]"
    npu_utils = types.ModuleType("torch_npu.npu.utils")

    def _is_gte_cann_version(version: str, module: str = "CANN") -> bool:
        """Whether the stack being checked runs CANN >= version (torch_npu asks the installed CANN)."""
        def key(text: str) -> tuple[int, ...]:
            return tuple(int(p) for p in re.findall(r"\d+", text)[:3])
        return key(cann_version) >= key(version)

    npu_utils._is_gte_cann_version = _is_gte_cann_version
    torch_npu = types.ModuleType("torch_npu")
    utils = types.ModuleType("torch_npu.utils")
    npu = types.ModuleType("torch_npu.npu")
    torch_npu.utils, torch_npu.npu, utils._error_code, npu.utils = utils, npu, error_code, npu_utils
    return {"torch_npu": torch_npu, "torch_npu.utils": utils, "torch_npu.utils._error_code": error_code,
            "torch_npu.npu": npu, "torch_npu.npu.utils": npu_utils}


def register_wheel(contents: WheelContents, cann_version: str = "8.5") -> Registration:
    """Define the wheel's schemas as `torch.ops.npu.*` / `torch.ops.atb.*` and load its meta kernels."""
    import torch

    if contents.version in _REGISTERED:
        return _REGISTERED[contents.version]
    if _REGISTERED:
        raise OpperfError(f"torch_npu {next(iter(_REGISTERED))} is already registered in this process; "
                          f"check {contents.version} in another process")
    defined: dict[str, set[str]] = {"npu": set(), "atb": set()}
    rejected: list[tuple[str, str]] = []
    libraries = []
    for namespace, schemas in (("npu", contents.npu_schemas), ("atb", contents.atb_schemas)):
        library = torch.library.Library(namespace, "FRAGMENT")
        libraries.append(library)
        for schema in schemas:
            name = schema.split("(", 1)[0]
            try:
                library.define(schema)
            except RuntimeError as exc:
                message = str(exc).splitlines()[0]
                if "already" not in message:       # a schema listed twice defines once
                    rejected.append((schema, message))
                continue
            defined[namespace].add(name.split(".", 1)[0])
    saved = {name: sys.modules.get(name) for name in _stand_in_modules(cann_version)}
    sys.modules.update(_stand_in_modules(cann_version))
    executed = []
    try:
        for name, source in contents.meta_sources.items():
            namespace: dict = {"__name__": name.removesuffix(".py").replace("/", "."), "__file__": name}
            exec(compile(source, name, "exec"), namespace)       # noqa: S102 - torch_npu's own meta kernels
            libraries.extend(v for v in namespace.values() if isinstance(v, torch.library.Library))
            executed.append(name)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    registration = Registration(defined=defined, rejected=rejected, meta_files=executed, libraries=libraries)
    _REGISTERED[contents.version] = registration
    return registration
