"""The replay stage in the workflow (Snakemake API, temporary copy): every row replayed, one edited
kernel definition re-runs that kernel's replay only."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from snakemake_api import run_workflow, tiny_cpu_replay_workflow

pytestmark = pytest.mark.workflow

DATABASE = ("CPU", "torch", "torch{}_cpu")


def test_replay_fills_every_row_and_an_edited_definition_reruns_only_its_kernel(tmp_path):
    workdir, config, root = tiny_cpu_replay_workflow(tmp_path / "wf")
    config["replay"]["unprofiled_power"] = "workload"      # the parse stage's rows are the replay jobs' input too
    report = f"reports/{root}/summary.json"
    run_workflow(workdir, [report], config=config)

    replayed = sorted((workdir / "results" / root / "replayed").glob("*.csv"))
    kernels = [p.stem for p in replayed]
    assert {"mm", "add", "silu"} <= set(kernels)
    for path in replayed:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        assert len(frame) > 0
        assert (frame["Replay Status"] == "ok").all(), (path.name, frame["Replay Error"].tolist())
        assert (frame["Average Duration(us)"] != "").all()
    assert list((workdir / "traces" / root / "mm").glob("*_S04_verify/replay_mm.py"))
    # Stage 4b ran (on by default) over the whole trace in its order: every row's calls, every row folded in.
    table = pd.read_csv(workdir / "results" / root / "phase_replay.csv", dtype=str, keep_default_na=False)
    assert sorted(table["Type"]) == sorted(kernels) and (table["Applied"] == "yes").all()
    for kernel in kernels:
        row = pd.read_csv(workdir / "data" / root / f"{kernel}.csv", dtype=str, keep_default_na=False).iloc[0]
        line = table[table["Type"] == kernel].iloc[0]
        assert row["Replay Phase Calls"] == line["Phase Calls"] == row["Profiling Sample Count"], kernel
        assert row["Average Duration(us)"] == line["Phase Replay Average Duration(us)"] != "", kernel
    # The report waited for every database job of its database: all kernel CSVs, op_mapping, msmodeling's
    # DeviceProfile (a cpu database) and manifest.
    timings = json.loads((workdir / report).read_text())["stage_timings_s"]
    assert timings["database"]["jobs"] == len(kernels) + 3
    assert (workdir / "data" / root / "msmodeling_device.py").is_file()
    assert timings["replay"]["jobs"] == len(kernels) + 1          # and stage 4b
    # The report names rows by their line in the database it waited for (rule replay_report's --database-dir).
    markdown = (workdir / f"reports/{root}/replay_report.md").read_text()
    assert f"`line` is the row's line in `data/{root}/{{Type}}.csv`, the database CSV the runtime reads" in markdown

    # A definition of a kernel type this database does not have, edited, and one of its own rewritten with
    # the same content: op_mapping.yaml reads neither, nothing re-runs.
    definitions = workdir / "config" / "kernels" / "torch"
    other = next(p for p in sorted(definitions.glob("*.yaml")) if p.stem not in kernels)
    other.write_text(other.read_text() + "# edited: not a kernel type of this database\n")
    mm_definition = definitions / "mm.yaml"
    mm_definition.write_text(mm_definition.read_text())
    assert run_workflow(workdir, [report], dry_run=True, config=config) == []

    with open(mm_definition, "a") as handle:
        handle.write("# edited: a definition change must re-measure this kernel only\n")
    plan = run_workflow(workdir, [report], dry_run=True, config=config)
    replays = [wildcards["kernel"] for rule, wildcards in plan if rule == "replay_kernel"]
    assert replays == ["mm"]
    # Stage 4b reads every replayed CSV, and every database CSV folds its table in.
    assert sorted(wildcards["kernel"] for rule, wildcards in plan if rule == "database_kernel") == sorted(kernels)
    assert {rule for rule, _ in plan} == {"replay_kernel", "phase_replay", "database_kernel", "database_op_mapping",
                                          "database_complete", "replay_report"}


def test_phase_replay_folds_the_phases_in_order_into_the_database_and_reruns_on_its_settings(tmp_path):
    """Stage 4b through the workflow: its table, its rows folded in by the database stage, and a change of its
    settings re-running it and the database, not the replays."""
    workdir, config, root = tiny_cpu_replay_workflow(tmp_path / "wf")
    # The trace's six calls (mm, add, silu twice), the whole trace: each row's two calls ran in the phase.
    config["replay"]["phase"] = {"enabled": True, "backends": ["cpu"]}
    kernels = [f"data/{root}/{kernel}.csv" for kernel in ("mm", "add", "silu")]
    run_workflow(workdir, kernels, config=config)
    table = pd.read_csv(workdir / "results" / root / "phase_replay.csv", dtype=str, keep_default_na=False)
    assert sorted(table["Type"]) == ["add", "mm", "silu"]
    assert (table["Phase Calls"] == "2").all() and (table["Applied"] == "yes").all()
    # A call the OS preempted (ten times the row's median and longer than any profiled call) is left out and
    # said so: on a loaded CI machine that happens to a few-microsecond CPU op.
    in_phase = re.compile(r"cpu profiler op time per call, in the workload's call order \(1 phase\(s\), 3 time\(s\)\)"
                          r"(, [1-5] interrupted call\(s\) left out)?")
    assert all(in_phase.fullmatch(method) for method in table["Phase Timing Method"])
    for kernel, path in zip(("mm", "add", "silu"), kernels):
        row = pd.read_csv(workdir / path, dtype=str, keep_default_na=False).iloc[0]
        replayed = pd.read_csv(workdir / "results" / root / "replayed" / f"{kernel}.csv", dtype=str,
                               keep_default_na=False).iloc[0]
        line = table[table["Type"] == kernel].iloc[0]
        # Both profiled calls were in the phase: the runtime's duration is the in-phase mean; the replay kept.
        assert row["Average Duration(us)"] == line["Phase Replay Average Duration(us)"] == row[
            "Replay Phase Average Duration(us)"]
        assert row["Replay Isolated Average Duration(us)"] == replayed["Average Duration(us)"] != ""
        assert row["Replay Phase Calls"] == "2" and "Replay Phase Calls" not in replayed.index
        method = row["Replay Timing Method"]
        assert method.endswith("; 2 of 2 calls replayed in the workload's phase(s): " + line["Phase Timing Method"])
    # Another phase setting re-runs stage 4b and the database, not the replays.
    config["replay"]["phase"].update(iterations=1)
    plan = run_workflow(workdir, kernels, dry_run=True, config=config)
    assert sorted(rule for rule, _ in plan) == ["database_kernel"] * 3 + ["phase_replay"]


def test_the_predicted_steps_of_the_target_models_are_a_target_that_follows_its_scenarios(tmp_path):
    """Stage 7b through the workflow: each grid target model's step at each configured scenario, from the finished
    database, in JSON and as the report's page; another scenario re-runs this job only."""
    workdir, config, root = tiny_cpu_replay_workflow(tmp_path / "wf")
    config["predict"] = {"scenarios": {"cpu": ["prefill:8", "decode:2x16"]}, "dtype": "float32"}
    config["grid"] = {"enabled": False, "target_models": {"cpu": ["opperf-tiny"]}}
    target = f"reports/{root}/predictions.json"
    run_workflow(workdir, [target], config=config)
    document = json.loads((workdir / target).read_text())
    assert document["model"] == "opperf-tiny" and document["dtype"] == "float32"
    assert [(s["model"], s["name"]) for s in document["scenarios"]] == [("opperf-tiny", "prefill:8"),
                                                                        ("opperf-tiny", "decode:2x16")]
    for scenario in document["scenarios"]:
        assert scenario["predicted_us"] > 0
        assert sum(scenario["status_time_share"].values()) == pytest.approx(1.0, abs=1e-5)
        assert scenario["predicted_us"] == pytest.approx(sum(q["latency_us"] * q["calls"]
                                                             for q in scenario["queries"]), rel=1e-4)
    page = (workdir / f"reports/{root}/predictions.md").read_text()
    assert "## opperf-tiny" in page and "prefill:8" in page and "decode:2x16" in page
    config["predict"]["scenarios"]["cpu"].append("prefill:16")
    assert [rule for rule, _ in run_workflow(workdir, [target], dry_run=True, config=config)] == ["predict_steps"]
