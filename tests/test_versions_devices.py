"""Version directories and the device catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from opperf import versions
from opperf.devices import load_catalog, resolve_device
from opperf.errors import OpperfError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name, parts", [
    ("vllm0.18.0_torch2.9.0_cann8.5", ("0.18.0", "2.9.0", "cann", "8.5", "")),
    ("vllm0.18.0_torch2.9.0_cann8.5_shape_generated", ("0.18.0", "2.9.0", "cann", "8.5", "shape_generated")),
    ("vllm0.11.0_torch2.11.0_cuda13.0", ("0.11.0", "2.11.0", "cuda", "13.0", "")),
    ("torch2.13.0_cpu", ("", "2.13.0", "cpu", "", "")),
])
def test_version_dirs_round_trip(name, parts):
    parsed = versions.parse_version_dir(name)
    assert (parsed.vllm, parsed.torch, parsed.runtime, parsed.runtime_version, parsed.suffix) == parts
    assert parsed.version_dir == name


def test_npu_version_dir_from_seed_flags():
    assert versions.npu_version_dir("0.18.0", "2.9.0", "8.5") == "vllm0.18.0_torch2.9.0_cann8.5"
    with pytest.raises(OpperfError, match="--cann-version"):
        versions.npu_version_dir("0.18.0", "2.9.0", "")


def test_bad_version_dir():
    with pytest.raises(OpperfError, match="not of the form"):
        versions.parse_version_dir("latest")


@pytest.mark.parametrize("stack, model, version_dir", [
    ("torch2.13.0_cpu", "opperf-tiny", "torch2.13.0_cpu"),               # the demo's database keeps the stack's name
    ("torch2.13.0_cpu", "OPPERF_tiny", "torch2.13.0_cpu"),               # any spelling of the demo's model
    ("torch2.13.0_cpu", "qwen3-32b", "torch2.13.0_cpu_Qwen3_32B"),       # a models.yaml model: its key
    ("torch2.13.0_cpu", "tests/data/workload/tiny_mistral.json", "torch2.13.0_cpu_hf_tiny_mistral"),
    ("torch2.13.0_cpu", "my_model/config.json", "torch2.13.0_cpu_hf_my_model"),   # named after its folder
    ("torch2.11.0_cuda13.0", "dsv3", "torch2.11.0_cuda13.0_DeepSeek_V3"),
    ("torch2.13.0_cpu_mine", "qwen3-32b", "torch2.13.0_cpu_mine"),      # a suffix of the user's own: as given
])
def test_a_model_other_than_the_demos_gets_a_database_of_its_own(stack, model, version_dir):
    assert versions.workload_database_version_dir(stack, model, REPO / "config" / "models.yaml") == version_dir
    versions.parse_version_dir(version_dir)               # a form every reader of a version_dir accepts


def test_replay_refuses_another_stacks_version_dir():
    here = versions.cpu_version_dir()
    versions.check_stack_matches(here, "cpu")
    with pytest.raises(OpperfError, match="refusing to write into torch1.0.0_cpu: torch"):
        versions.check_stack_matches("torch1.0.0_cpu", "cpu")
    with pytest.raises(OpperfError, match="the database is for cann"):
        versions.check_stack_matches(f"vllm0.18.0_{here.replace('_cpu', '')}_cann8.5", "cpu")


def test_catalog_has_the_design_devices_and_full_name_aliases():
    catalog = load_catalog()
    assert {"A2", "A3", "H100", "H200", "CPU"} <= set(catalog)
    assert resolve_device("ATLAS_800_A3_752T_128G_DIE").name == "A3"
    assert catalog["A3"].backend == "npu" and catalog["H200"].backend == "cuda"
    assert catalog["H200"].memory_gb == 141 and catalog["H100"].peak_tflops["bfloat16"] == 989
    with pytest.raises(OpperfError, match="unknown device 'B200'"):
        resolve_device("B200")
