"""Shared fixtures: the real Ascend fixture, the repository root, PATH so workflow jobs find this Python, and the
benchmark scripts as modules."""

from __future__ import annotations

import contextlib
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# Workflow jobs run `python scripts/...`: make that the interpreter running the tests.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


@contextlib.contextmanager
def benchmark_scripts(*names: str):
    """The named scripts of benchmarks/ and benchmarks/probes/ imported as modules, with both folders on sys.path
    only meanwhile (they import each other by name)."""
    folders = [str(REPO / "benchmarks"), str(REPO / "benchmarks" / "probes")]
    sys.path[:0] = folders
    try:
        yield tuple(importlib.import_module(name) for name in names)
    finally:
        for folder in folders:
            sys.path.remove(folder)


ASCEND_FIXTURE = REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv"


@pytest.fixture
def ascend_fixture() -> Path:
    return ASCEND_FIXTURE


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture(scope="module")
def cpu_parsed(tmp_path_factory):
    """The reference decoder's CPU trace (a one-layer opperf-tiny) through the parse stage."""
    out = tmp_path_factory.mktemp("cpu") / "parsed"
    subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path",
                    "tests/data/parse/cpu_decoder_trace.json", "--database-path", str(out)],
                   check=True, capture_output=True)
    return out


def built_experts(config_path):
    """The experts module of the first MoE layer of the model transformers builds from a config.json, on meta: what
    a MoE model's expert dims are checked against."""
    import torch

    from opperf.workload.transformers_model import hf_config_of, read_config

    transformers, hf_config = hf_config_of(read_config(config_path))
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return next(module for name, module in model.named_modules() if name.endswith("mlp.experts"))
