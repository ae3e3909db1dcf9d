"""Version directories: the name that says which software stack a database was measured on.

`vllm{v}_torch{t}_cann{c}` for NPU (as the seed), `vllm{v}_torch{t}_cuda{c}` for CUDA,
`torch{t}_cpu` (or `torch{t}_cuda{c}`) where no serving stack is involved, each with an optional
`_suffix` for staging (e.g. `_shape_generated`).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from opperf.errors import OpperfError

_VERSION_DIR_RE = re.compile(
    r"^(?:vllm(?P<vllm>[0-9][0-9A-Za-z.+]*)_)?torch(?P<torch>[0-9][0-9A-Za-z.+]*)"
    r"_(?:(?P<runtime>cann|cuda)(?P<runtime_version>[0-9][0-9A-Za-z.]*)|(?P<cpu>cpu))"
    r"(?:_(?P<suffix>[A-Za-z0-9_]+))?$"
)


@dataclass(frozen=True)
class StackVersions:
    torch: str
    runtime: str                # "cann", "cuda" or "cpu"
    runtime_version: str = ""   # "" for cpu
    vllm: str = ""
    suffix: str = ""

    @property
    def version_dir(self) -> str:
        name = f"vllm{self.vllm}_" if self.vllm else ""
        name += f"torch{self.torch}_"
        name += "cpu" if self.runtime == "cpu" else f"{self.runtime}{self.runtime_version}"
        return name + (f"_{self.suffix}" if self.suffix else "")


def parse_version_dir(name: str) -> StackVersions:
    match = _VERSION_DIR_RE.match(name)
    if not match:
        raise OpperfError(
            f"version directory {name!r} is not of the form vllm<v>_torch<t>_cann<c>, "
            "vllm<v>_torch<t>_cuda<c> or torch<t>_cpu (optionally with _<suffix>)")
    runtime = "cpu" if match["cpu"] else match["runtime"]
    return StackVersions(torch=match["torch"], runtime=runtime, runtime_version=match["runtime_version"] or "",
                         vllm=match["vllm"] or "", suffix=match["suffix"] or "")


def npu_version_dir(vllm: str, torch: str, cann: str, suffix: str = "") -> str:
    """The seed's `vllm{v}_torch{t}_cann{c}` from the `--vllm-version/--torch-version/--cann-version` flags."""
    missing = [flag for flag, value in (("--vllm-version", vllm), ("--torch-version", torch),
                                        ("--cann-version", cann)) if not value]
    if missing:
        raise OpperfError(f"give --database-path, or all of --vllm-version, --torch-version and "
                          f"--cann-version (missing: {', '.join(missing)})")
    return StackVersions(torch=torch, runtime="cann", runtime_version=cann, vllm=vllm, suffix=suffix).version_dir


def _short(version: str) -> str:
    """'2.13.0+cpu' → '2.13.0'; local build tags are not part of a stack's identity."""
    return version.split("+", 1)[0]


def installed_torch_version() -> str:
    """torch's version from package metadata (no `import torch`: Snakefiles call this)."""
    try:
        return _short(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError as exc:
        raise OpperfError("torch is not installed: pip install torch") from exc


def installed_torch_cuda_version() -> str:
    """The CUDA version torch was built for ('' for CPU builds), read from torch/version.py without importing torch."""
    import importlib.util
    import re as _re
    from pathlib import Path

    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise OpperfError("torch is not installed: pip install torch")
    version_file = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    match = _re.search(r"^cuda(?:: [^=]+)?\s*=\s*['\"]([0-9.]+)['\"]", version_file.read_text(), _re.MULTILINE)
    return match.group(1) if match else ""


def cpu_version_dir() -> str:
    return StackVersions(torch=installed_torch_version(), runtime="cpu").version_dir


VERSION_DIR_RUNTIME = {"cpu": "cpu", "cuda": "cuda", "npu": "cann"}


def workload_version_dir(backend: str, configured: str | None = None) -> str:
    """The version_dir the reference workload's database gets on `backend`: torch{t}_cpu, torch{t}_cuda{c} or
    torch{t}_cann{c}.

    `configured` (config workload.version_dir) is used as given, once it parses and names `backend`'s runtime:
    a submit host without the device's toolchain plans with it, and the job refuses to profile on a host
    whose stack differs. Otherwise it is read from this host: cuda from torch's metadata, npu from CANN.
    """
    if configured:
        check_workload_version_dir(configured, backend)
        return configured
    if backend == "cpu":
        return cpu_version_dir()
    if backend == "cuda":
        cuda = installed_torch_cuda_version()
        if not cuda:
            raise OpperfError("workload back end 'cuda' asked for, but the installed torch is a CPU build")
        return StackVersions(torch=installed_torch_version(), runtime="cuda", runtime_version=cuda).version_dir
    if backend == "npu":
        return running_stack("npu").version_dir
    raise OpperfError(f"unknown back end {backend!r} (expected cpu, cuda or npu)")


def check_workload_version_dir(configured: str, backend: str) -> StackVersions:
    """A configured workload.version_dir: it parses, and names the runtime the workload's back end measures on."""
    wanted = parse_version_dir(configured)
    if backend in VERSION_DIR_RUNTIME and wanted.runtime != VERSION_DIR_RUNTIME[backend]:
        raise OpperfError(f"{configured!r} is a {wanted.runtime} version directory, but the workload runs on "
                          f"back end {backend!r} (expected torch<t>_{VERSION_DIR_RUNTIME[backend]}…)")
    return wanted


# The workload model of the shipped demo (config.schema.yaml's default): its database keeps the stack's own name.
DEMO_MODEL = "opperf-tiny"


def workload_database_version_dir(stack_version_dir: str, model: str, models: Mapping[str, object] | str | Path) -> str:
    """The version_dir of the database profiled from workload `model`: the stack's (`torch2.13.0_cpu`) for the
    demo's model, else the stack's followed by the model's name (`torch2.13.0_cpu_hf_my_model`,
    `torch2.11.0_cuda13.0_Qwen3_32B`), so that a user's model never lands in, and writes over, the demo's database.

    `model` is a key or alias of `models` (models.yaml's mapping or path) or a transformers config.json, named as
    databases and reports name it (opperf.model_names.model_reference). A stack version_dir that carries a suffix already (workload.version_dir
    `torch2.13.0_cpu_mine`) is the user's name for the folder: kept as it is.
    """
    from opperf.model_names import model_reference

    if parse_version_dir(stack_version_dir).suffix:
        return stack_version_dir
    name = model_reference(model, models).name
    if name == DEMO_MODEL:
        return stack_version_dir
    return f"{stack_version_dir}_{re.sub(r'[^A-Za-z0-9]+', '_', name).strip('_')}"


def running_stack(backend: str) -> StackVersions:
    """What this process would measure with on `backend` (cpu/cuda from torch's metadata without importing it:
    the replay job's parent stays light; npu imports torch for CANN's version)."""
    if backend == "cpu":
        return StackVersions(torch=installed_torch_version(), runtime="cpu")
    if backend == "cuda":
        return StackVersions(torch=installed_torch_version(), runtime="cuda",
                             runtime_version=installed_torch_cuda_version())
    import torch

    torch_version = _short(torch.__version__)
    if backend == "npu":
        return StackVersions(torch=torch_version, runtime="cann", runtime_version=_cann_version())
    raise OpperfError(f"unknown back end {backend!r} (expected cpu, cuda or npu)")


def _cann_version() -> str:
    import os
    from pathlib import Path

    for home in (os.environ.get("ASCEND_TOOLKIT_HOME"), os.environ.get("ASCEND_HOME_PATH"),
                 "/usr/local/Ascend/ascend-toolkit/latest"):
        if not home:
            continue
        for info in Path(home).glob("*/ascend_toolkit_install.info"):
            for line in info.read_text().splitlines():
                if line.startswith("version="):
                    return ".".join(line.split("=", 1)[1].strip().split(".")[:2])
    raise OpperfError("cannot find the CANN version: set ASCEND_TOOLKIT_HOME (source set_env.sh)")


def check_stack_matches(version_dir: str, backend: str) -> None:
    """Refuse to write numbers measured on one stack into another stack's database."""
    wanted = parse_version_dir(version_dir)
    running = running_stack(backend)
    problems = []
    if wanted.torch != running.torch:
        problems.append(f"torch {running.torch} is running, the database is for torch {wanted.torch}")
    if wanted.runtime != running.runtime:
        problems.append(f"back end {backend} measures on {running.runtime}, the database is for {wanted.runtime}")
    elif wanted.runtime_version and not running.runtime_version.startswith(wanted.runtime_version):
        problems.append(f"{running.runtime} {running.runtime_version} is running, "
                        f"the database is for {wanted.runtime} {wanted.runtime_version}")
    if problems:
        raise OpperfError(f"refusing to write into {version_dir}: " + "; ".join(problems)
                          + " (wrong-stack numbers would silently corrupt the database)")


def hccl_version_dir(cann_version: str) -> str:
    """The runtime's directory of a CANN version's collectives: `8.5` -> `v8.5` (its data/{device}/hccl/v8.5/)."""
    return cann_version if cann_version.startswith("v") else f"v{cann_version}"
