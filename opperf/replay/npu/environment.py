"""Checks that an Ascend replay can run here, each failure saying exactly what is missing and how to fix it.

Three independent things can be missing: the device stack (torch_npu importable, an NPU visible),
the profiler (`msprof` on PATH, from the CANN toolkit), and for the vLLM-Ascend custom-OPP kernels
the two environment variables that make CANN load them (`ASCEND_CUSTOM_OPP_PATH` pointing at the
vendor directory, `LD_LIBRARY_PATH` holding its `op_api/lib`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from opperf.errors import DeviceUnavailableError, OpperfError

CUSTOM_OPP_VARIABLE = "ASCEND_CUSTOM_OPP_PATH"
LIBRARY_PATH_VARIABLE = "LD_LIBRARY_PATH"
VISIBLE_DEVICES_VARIABLE = "ASCEND_RT_VISIBLE_DEVICES"
_VENDOR_SUBDIR = Path("_cann_ops_custom") / "vendors" / "vllm-ascend"
_OP_API_LIB = Path("op_api") / "lib"


@functools.lru_cache(maxsize=None)
def custom_opp_kernels() -> frozenset[str]:
    """Kernel types shipped by vLLM-Ascend as custom operator packages (seed 2.9), not by CANN itself.

    The NPU kernel definitions' `requires_custom_opp` flag is the one source of this list.
    """
    from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR, load_definitions

    definitions = load_definitions(DEFAULT_DEFINITIONS_DIR / "npu", backend="npu")
    return frozenset(t for d in definitions.values() if d.requires_custom_opp for t in d.kernel_types)


def _path_entries(value: str | None) -> list[str]:
    return [entry for entry in (value or "").split(os.pathsep) if entry.strip()]


def _vllm_ascend_vendor_dir() -> Path | None:
    """vLLM-Ascend's custom-OPP vendor directory, found without importing vllm_ascend (it is heavy)."""
    try:
        spec = importlib.util.find_spec("vllm_ascend")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / _VENDOR_SUBDIR


def custom_opp_problems(kernel_types: Iterable[str], environ: Mapping[str, str] | None = None,
                        vendor_dir: Path | None = None) -> list[str]:
    """What is missing for the custom-OPP kernels among `kernel_types` (empty: nothing, or none needed).

    `vendor_dir` is vLLM-Ascend's vendor directory if known (used to suggest exact values).
    """
    environ = os.environ if environ is None else environ
    needing = sorted(set(kernel_types) & custom_opp_kernels())
    if not needing:
        return []
    problems: list[str] = []
    opp_entries = _path_entries(environ.get(CUSTOM_OPP_VARIABLE))
    library_entries = {os.path.normpath(e) for e in _path_entries(environ.get(LIBRARY_PATH_VARIABLE))}
    existing = [Path(e) for e in opp_entries if Path(e).is_dir()]
    if not opp_entries:
        problems.append(f"{CUSTOM_OPP_VARIABLE} is not set")
    elif not existing:
        missing = ", ".join(f"{e} is not a directory" for e in opp_entries)
        problems.append(f"no {CUSTOM_OPP_VARIABLE} entry exists ({missing})")
    else:
        # A vendor directory ships its op_api/lib; that library must be on LD_LIBRARY_PATH for CANN to load it.
        vendors = [e for e in existing if (e / _OP_API_LIB).is_dir()] or existing
        libraries = [os.path.normpath(e / _OP_API_LIB) for e in vendors]
        if not any(library in library_entries for library in libraries):
            problems.append(f"{LIBRARY_PATH_VARIABLE} lacks {libraries[0]} (the op_api library of {vendors[0]})")
    if not problems:
        return []
    vendor = vendor_dir or Path("<vllm_ascend package>") / _VENDOR_SUBDIR
    return [f"kernel(s) {', '.join(needing)} come from vLLM-Ascend's custom OPP: " + "; ".join(problems)
            + f". Fix: export {CUSTOM_OPP_VARIABLE}={vendor}:${CUSTOM_OPP_VARIABLE} && "
            f"export {LIBRARY_PATH_VARIABLE}={vendor / _OP_API_LIB}:${LIBRARY_PATH_VARIABLE}"]


def check_custom_opp(kernel_types: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
    """Raise an OpperfError naming every missing piece before any custom-OPP kernel is replayed."""
    kernel_types = list(kernel_types)
    if not set(kernel_types) & custom_opp_kernels():
        return
    problems = custom_opp_problems(kernel_types, environ, vendor_dir=_vllm_ascend_vendor_dir())
    if problems:
        raise OpperfError(problems[0], field=CUSTOM_OPP_VARIABLE)


def check_msprof(executable: str = "msprof") -> str:
    """The msprof binary's path, or a DeviceUnavailableError saying how to get it on PATH."""
    found = shutil.which(executable)
    if found is None:
        home = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
        raise DeviceUnavailableError(
            f"{executable} is not on PATH: the NPU replay times kernels with msprof from the CANN toolkit. "
            f"Run `source {Path(home).parent / 'set_env.sh'}` (or pass --prof-path to parse an existing PROF_* "
            "directory instead)")
    return found


def check_npu_available() -> int:
    """The number of visible Ascend devices; a DeviceUnavailableError saying what is missing if none."""
    if importlib.util.find_spec("torch_npu") is None:
        raise DeviceUnavailableError(
            "torch_npu is not installed: the npu back end needs torch_npu built for this torch version "
            "(pip install torch_npu==<torch version>) and the CANN toolkit (source set_env.sh)")
    try:
        import torch
        import torch_npu  # noqa: F401  (registers torch.npu)
    except Exception as exc:  # torch_npu raises plain RuntimeError/OSError when CANN libraries are missing
        raise DeviceUnavailableError(f"torch_npu cannot be imported ({type(exc).__name__}: {exc}); "
                                     "source the CANN toolkit's set_env.sh first") from exc
    count = torch.npu.device_count() if torch.npu.is_available() else 0
    if count == 0:
        visible = os.environ.get(VISIBLE_DEVICES_VARIABLE)
        hint = f" ({VISIBLE_DEVICES_VARIABLE}={visible})" if visible is not None else ""
        raise DeviceUnavailableError(f"no Ascend NPU is visible to torch_npu{hint}; check `npu-smi info` and "
                                     "the driver installation")
    return count
