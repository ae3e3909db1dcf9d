"""benchmarks/probes/heater_ab.py on the committed H100 A/B (benchmarks/results/heater_ab/): exact values, and only the
kernel types both replays finished are compared."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import benchmark_scripts

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "heater_ab"


@pytest.fixture(scope="module")
def heater_ab():
    with benchmark_scripts("heater_ab") as (module,):
        yield module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("heater_ab")
    with tarfile.open(RESULTS / "databases.tar.gz") as archive:
        archive.extractall(root, filter="data")
    return root


def test_the_committed_table_is_what_the_databases_give(heater_ab, runs, capsys, tmp_path):
    assert heater_ab.main([str(runs / "silu_mul_round1"), str(runs / "small_rows"),
                           "--json", str(tmp_path / "out.json")]) == 0
    table = capsys.readouterr().out
    readme = (RESULTS / "README.md").read_text()
    for workload in ("| silu_mul_round1 | moe |", "| small_rows | olmoe |", "| small_rows | qwen2 |"):
        line = next(line for line in table.splitlines() if line.startswith(workload))
        assert line in readme
    moe = next(r for r in heater_ab.compare(runs / "silu_mul_round1", ("after-gemm", "cooldown"))
               if r["workload"] == "moe")
    assert moe["after-gemm"]["rows"] == moe["cooldown"]["rows"] == 610
    assert moe["after-gemm"]["median_ratio"] == pytest.approx(1.091, abs=5e-4)
    assert moe["cooldown"]["median_ratio"] == pytest.approx(0.995, abs=5e-4)


def test_types_a_cut_off_replay_did_not_finish_are_left_out(heater_ab, runs, tmp_path):
    qwen2 = next(r for r in heater_ab.compare(runs / "small_rows", ("after-gemm", "cooldown"))
                 if r["workload"] == "qwen2")
    assert len(qwen2["kernel_types"]) == 26 and "silu" not in qwen2["kernel_types"]
    run = tmp_path / "run"
    shutil.copytree(runs / "small_rows", run)
    (run / "after-gemm" / "qwen2" / "replay.log").unlink()            # no log: every CSV counts, on both sides
    (run / "cooldown" / "qwen2" / "replay.log").unlink()
    qwen2 = next(r for r in heater_ab.compare(run, ("after-gemm", "cooldown")) if r["workload"] == "qwen2")
    assert "silu" in qwen2["kernel_types"] and qwen2["after-gemm"]["rows"] > 358


def test_a_directory_without_the_policy_is_refused(heater_ab, tmp_path, capsys):
    assert heater_ab.main([str(tmp_path)]) == 1
    assert "no after-gemm/ directory" in capsys.readouterr().err
