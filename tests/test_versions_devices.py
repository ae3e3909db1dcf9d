"""Version directories and the device catalog."""

from __future__ import annotations

import pytest

from opperf import versions
from opperf.devices import load_catalog, resolve_device
from opperf.errors import OpperfError


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
