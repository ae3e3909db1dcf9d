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


def test_power_state_split_says_how_much_of_the_gap_throttled_rows_make(cuda_replay):
    """Rows the workload ran 50 MHz or more under the full clock (the highest the profile or the replay saw) are apart
    from those at full clock and from rows profiled without the sampler; the parts' absolute contributions add up to
    the time-weighted gap."""
    def row(replay, profiled, calls, clock):
        return {"Average Duration(us)": str(replay), "Profiling Average Duration(us)": str(profiled),
                "Profiling Sample Count": str(calls), "Profiling Average SM Clock(MHz)": clock}

    rows = [row(90.0, 100.0, 10, "1700"),       # a throttled prefill row, replayed 10 % fast
            row(9.0, 10.0, 10, "1935"),         # 45 MHz under: still at full clock
            row(11.0, 10.0, 10, "1960"),
            row(5.0, 5.0, 20, ""),              # profiled without the sampler
            row("", 5.0, 4, "1975")]            # not replayed: left out
    rows[0]["Replay SM Clock(MHz)"] = "1980"    # the full clock, as the replay saw it
    split = cuda_replay.power_state_split(rows)
    assert list(split) == ["throttled_in_workload", "full_clock_in_workload", "no_profiled_clock"]
    throttled, full, unknown = split.values()
    assert (throttled["rows"], full["rows"], unknown["rows"]) == (1, 2, 1)
    assert throttled["full_clock_mhz"] == 1980.0
    assert throttled["profiled_time_share"] == pytest.approx(1000 / 1300)
    assert throttled["signed_gap_contribution"] == pytest.approx(-100 / 1300)
    assert full["gap_contribution"] == pytest.approx(20 / 1300) and full["signed_gap_contribution"] == 0.0
    assert full["median_ratio"] == pytest.approx(1.0) and unknown["gap_contribution"] == 0.0
    whole = cuda_replay.gap_summary([(90.0, 100.0, 10), (9.0, 10.0, 10), (11.0, 10.0, 10), (5.0, 5.0, 20)])
    assert sum(part["gap_contribution"] for part in split.values()) == pytest.approx(whole["time_weighted_gap"])


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


def test_a_workloads_phase_replay_summary_comes_from_its_stage_4b_table(cuda_replay, tmp_path):
    import shutil

    assert cuda_replay.phase_summary(tmp_path, "dense", None) is None          # the stage did not run
    run = tmp_path / "dense" / "insitu"
    run.mkdir(parents=True)
    shutil.copy("benchmarks/results/phase_stage/h200_a/phase_replay_dense.csv", run / "phase_replay.csv")
    summary = cuda_replay.phase_summary(tmp_path, "dense", None)
    assert {k: summary[k] for k in ("rows", "rows_applied", "calls")} == {"rows": 232, "rows_applied": 145,
                                                                          "calls": 2754}
    assert summary["time_ratio"] == pytest.approx(0.98141, abs=1e-5)
    assert summary["method"].endswith("in the workload's call order (9 phase(s), 1 time(s))")


def test_transformers_configs_become_workloads_with_their_own_layer_count(cuda_replay, tmp_path):
    from pathlib import Path

    tiny = Path("benchmarks/workloads/tiny")
    workloads = cuda_replay.config_workloads([tiny], smoke=True)
    assert sorted(workloads) == sorted(f"hf_{path.stem}" for path in tiny.glob("*.json")) and len(workloads) == 24
    assert workloads["hf_qwen3_next"].model == "benchmarks/workloads/tiny/qwen3_next.json"
    assert (workloads["hf_qwen3_next"].layers, workloads["hf_llama"].layers) == (4, 2)   # a hybrid needs attention
    assert workloads["hf_llama"].prefill_lengths == (16,) and workloads["hf_llama"].unseen
    config = tmp_path / "my_model.json"
    config.write_text('{"model_type": "llama", "num_hidden_layers": 3}')
    [(name, workload)] = cuda_replay.config_workloads([config], smoke=False).items()
    assert name == "hf_my_model" and workload.layers == 3 and workload.prefill_lengths == (128, 512, 2048)
