"""Issue 18's gates as benchmarks/cuda_replay.py and benchmarks/replay_gates.py compute them: exact verdicts on
small, hand-made reports and replayed databases."""

from __future__ import annotations

import csv

import pytest
from conftest import benchmark_scripts


@pytest.fixture(scope="module")
def cuda_replay():
    with benchmark_scripts("cuda_replay") as (module,):
        yield module


@pytest.fixture(scope="module")
def replay_gates():
    with benchmark_scripts("replay_gates") as (module,):
        yield module


def _type(share, median):
    return {"rows": 3, "median_gap": median, "p90_gap": median, "time_weighted_gap": median, "median_ratio": 1.0,
            "profiled_time_share": share}


def test_gates_name_every_target_and_the_types_over_it(cuda_replay):
    entry = {"median_gap": 0.029, "p90_gap": 0.121, "time_weighted_gap": 0.01, "repeatability_median": None,
             "large_elementwise_ratio": 0.969}
    per_type = {"mm": _type(0.6, 0.01), "sum": _type(0.013, 0.053), "bincount": _type(0.004, 0.30)}
    gates = cuda_replay.gates(entry, per_type)
    assert gates["median_gap"] == {"value": 0.029, "target": 0.03, "met": True}
    assert gates["p90_gap"]["met"] is False and gates["time_weighted_gap"]["met"] is True
    assert gates["repeatability_median"]["met"] is None          # not measured: neither met nor failed
    assert gates["type_median_gap"] == {"value": {"sum": 0.053}, "target": 0.05, "met": False}   # bincount < 1 %
    assert gates["large_elementwise_ratio"] == {"value": 0.969, "target": [0.97, 1.03], "met": False}
    line = cuda_replay.gates_table([{"name": "w", "unseen": True, **entry, "large_elementwise_rows": 7,
                                     "gates": gates}])[2]
    assert line == ("| w | True | 2.9 % | **12.1 %** ✗ | 1.0 % | - | **sum 5.3 %** ✗ | **0.969** ✗ (7 rows) | - |")


def test_large_elementwise_ratio_takes_elementwise_rows_of_20_us_or_more(cuda_replay):
    def row(kind, replay, profiled):
        return {"_type": kind, "Average Duration(us)": str(replay), "Profiling Average Duration(us)": str(profiled)}

    rows = [row("mul", 19.0, 20.0), row("silu", 21.0, 20.0), row("copy_", 99.0, 100.0),
            row("mm", 50.0, 100.0), row("add", 1.0, 19.9)]
    assert cuda_replay.large_elementwise(rows) == {"large_elementwise_rows": 3, "large_elementwise_ratio": 0.99}


def test_replay_gates_fills_an_older_report_from_its_databases(replay_gates, tmp_path):
    database = tmp_path / "iv" / "w" / "insitu" / "data" / "H100" / "torch" / "v"
    database.mkdir(parents=True)
    with open(database / "mul.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["Average Duration(us)", "Profiling Average Duration(us)"])
        writer.writeheader()
        writer.writerows([{"Average Duration(us)": 30.0, "Profiling Average Duration(us)": 30.0},
                          {"Average Duration(us)": 2.0, "Profiling Average Duration(us)": 4.0}])
    report = {"repeatability": {"rows": 10, "median": 0.004},
              "workloads": [{"name": "w", "unseen": True, "median_gap": 0.02, "p90_gap": 0.05,
                             "time_weighted_gap": 0.01}],
              "per_workload": {"w": {"insitu": {"per_type": {"mul": _type(1.0, 0.02)}}}}}
    [entry] = replay_gates.evaluate(report, tmp_path)
    assert entry["repeatability_median"] == 0.004 and entry["repeatability_of"].startswith("the report's run")
    assert entry["large_elementwise_rows"] == 1 and entry["large_elementwise_ratio"] == 1.0
    assert all(gate["met"] for gate in entry["gates"].values())
    [bare] = replay_gates.evaluate({**report, "repeatability": {"rows": 0, "median": None}}, None)
    assert bare["gates"]["large_elementwise_ratio"]["met"] is None and bare["gates"]["repeatability_median"]["met"] is None


def test_a_call_can_replay_some_runs_and_report_them_all(cuda_replay):
    """A workload too long for one device call replays `insitu`, then `insitu-repeat` in the next call."""
    from types import SimpleNamespace

    args = SimpleNamespace(policies=["insitu", "flush"], repeat=True, replay_runs=None)
    assert cuda_replay.runs_to_replay(args) == cuda_replay.replay_runs(args) == ["insitu", "flush", "insitu-repeat"]
    args.replay_runs = ["insitu-repeat"]
    assert cuda_replay.runs_to_replay(args) == ["insitu-repeat"]
    assert cuda_replay.replay_runs(args) == ["insitu", "flush", "insitu-repeat"]      # what the report reads
