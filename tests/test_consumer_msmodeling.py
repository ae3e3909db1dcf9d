"""msmodeling itself, run unmodified: found beside the project without being told, its commit read, a database
device it does not ship registered through the launcher, and the queries its own ModelRunner issues recorded.

Needs msmodeling's checkout (`$OPPERF_MSMODELING_DIR`, else the pinned copy in ../shared/msmodeling) and its Python
dependencies (the `msmodeling` extra, part of `.[test]`); elsewhere these tests skip and say why."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from opperf.consumer.msmodeling_device import msmodeling_name, write_device_profile
from opperf.consumer.msmodeling_env import LAUNCHER, find_msmodeling, run_cli
from opperf.devices import load_catalog

REPO = Path(__file__).resolve().parent.parent
INSTALL = find_msmodeling()
pytestmark = pytest.mark.skipif(INSTALL is None, reason="no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay "
                                                         "the pinned copy in ../shared/msmodeling")
RECORDER = LAUNCHER.with_name("msmodeling_record.py")
TINY_DENSE = REPO / "tests" / "data" / "workload" / "tiny_mistral.json"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A directory holding the tiny dense config as config.json (msmodeling takes a model directory)."""
    directory = tmp_path_factory.mktemp("tiny_dense")
    (directory / "config.json").write_text(TINY_DENSE.read_text())
    return directory


def text_generate(model_dir: Path, scenario: list[str], device: str) -> list[str]:
    return ["inference", "text-generate", str(model_dir), *scenario, "--device", device,
            "--num-hidden-layers-override", "2", "--quantize-linear-action", "DISABLED"]


def test_the_pinned_copy_is_found_without_being_told_and_its_commit_read(monkeypatch):
    monkeypatch.delenv("OPPERF_MSMODELING_DIR", raising=False)
    found = find_msmodeling()
    if found is None:
        pytest.skip("no ../shared/msmodeling beside the project")
    assert found.found_by == "../shared/msmodeling"
    assert (found.commit, found.commit_source) == ("84fec853d6708256ca4fecf143d8b656a3a3496e", "SNAPSHOT.md")


def test_a_directory_that_is_no_checkout_is_refused(tmp_path):
    from opperf.errors import OpperfError

    with pytest.raises(OpperfError, match="is not a msmodeling checkout"):
        find_msmodeling(tmp_path)


@pytest.mark.parametrize("device_key", ["H200", "CPU"])
def test_the_database_device_profile_loads_in_msmodelings_own_cli(device_key, model_dir, tmp_path):
    device = load_catalog()[device_key]
    profile = write_device_profile(device, tmp_path)
    done = run_cli(INSTALL, profile, text_generate(model_dir, ["--num-queries", "2", "--query-length", "1",
                                                               "--context-length", "64", "--decode"],
                                                  msmodeling_name(device)), timeout_s=600)
    assert "Total time for analytic" in done.stdout
    # Without the profile msmodeling's own parser refuses the device name.
    refused = subprocess.run([INSTALL.python, str(LAUNCHER), str(INSTALL.directory), "--",
                              *text_generate(model_dir, ["--num-queries", "1", "--query-length", "8"],
                                             msmodeling_name(device))], capture_output=True, text=True)
    assert refused.returncode != 0 and "invalid choice" in refused.stderr


def record(model_dir: Path, scenarios: list[str], out: Path) -> dict:
    """The recorder's document for `scenarios`, every one recorded in one msmodeling process."""
    subprocess.run([INSTALL.python, str(RECORDER), str(INSTALL.directory), "--output", str(out),
                    *(f"--scenario={scenario}" for scenario in scenarios), "--",
                    *text_generate(model_dir, [], "TEST_DEVICE")[2:]], check=True, capture_output=True,
                   text=True, timeout=600)
    return json.loads(out.read_text())


def calls_of(scenario: dict, op: str) -> list[dict]:
    return [call for call in scenario["calls"] if call["op"] == op]


def test_the_runner_asks_for_paged_attention_and_the_cache_write_with_its_own_shapes(model_dir, tmp_path):
    # tiny_mistral: hidden 64, 4 heads, 2 KV heads, head_dim 16; msmodeling builds in float16, 128-token blocks.
    document = record(model_dir, ["decode:4x512", "prefill:64"], tmp_path / "queries.json")
    decode, prefill = document["scenarios"]
    assert (decode["name"], prefill["name"]) == ("decode:4x512", "prefill:64")
    assert decode["msmodeling_args"][-7:] == ["--num-queries", "4", "--query-length", "1", "--context-length",
                                              "512", "--decode"]
    assert document["device"] == "TEST_DEVICE" and document["msmodeling_args_common"][0] == str(model_dir)
    [attention] = calls_of(decode, "tensor_cast.attention.default")
    query, key, value, mask, block_table, query_start, seq_lens, query_lens = attention["args"]
    assert attention["count"] == 2                              # one per layer
    assert query == {"shape": [4, 64], "dtype": "float16"}
    assert key["shape"][1:] == [128, 2, 16] and value == key and mask is None
    assert block_table["shape"] == [4, 5]                      # ceil(513 / 128) blocks per sequence
    assert query_start["values"] == [0, 1, 2, 3, 4]
    assert seq_lens["values"] == [513] * 4 and query_lens["values"] == [1] * 4
    [cache_write] = calls_of(decode, "tensor_cast.reshape_and_cache.default")
    assert [arg["shape"] for arg in cache_write["args"][:2]] == [[4, 32], [4, 32]]
    assert cache_write["args"][3]["shape"] == [4] and cache_write["count"] == 2

    [attention] = calls_of(prefill, "tensor_cast.attention.default")
    assert attention["args"][0] == {"shape": [64, 64], "dtype": "float16"}
    assert attention["args"][6]["values"] == [64] and attention["args"][7]["values"] == [64]
    # Neither step asks for what the transformers model's own attention would issue.
    assert not {c["op"] for c in decode["calls"] + prefill["calls"]} & {
        "aten._scaled_dot_product_flash_attention_for_cpu.default", "aten.scaled_dot_product_attention.default",
        "aten.bmm.default"}
