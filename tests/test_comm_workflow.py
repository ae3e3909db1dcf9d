"""The comm stage in the workflow (Snakemake API, temporary copy): one job per collective CSV, a real
2-process gloo run of one, and a code change re-collecting it."""

from __future__ import annotations

import pandas as pd
import pytest

from opperf.versions import installed_torch_version
from snakemake_api import copy_workflow, run_workflow

pytestmark = pytest.mark.workflow

QUICK = {"bytes_grid": ["1KiB", "4KiB"], "warmup_iters": 1, "min_iters": 3, "max_iters": 3}


def _comm_jobs(plan):
    return sorted((w["device"], w["comm"], w["comm_version"], w["collective"])
                  for rule, w in plan if rule == "comm_collective")


def test_all_plans_one_job_per_collective_csv(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    plan = run_workflow(workdir, dry_run=True, config={"workload": {"enabled": False}})
    version = f"torch{installed_torch_version()}"
    assert _comm_jobs(plan) == [("CPU", "gloo", version, op)
                                for op in ("all_gather", "all_reduce", "all_to_all", "reduce_scatter")]
    hccl = {"comm": {"backend": "hccl", "device": "A3", "nproc": 16, "num_devices": [16, 2], "version_dir": "v8.5"}}
    plan = run_workflow(workdir, dry_run=True, config={"workload": {"enabled": False}, **hccl})
    assert [job[3] for job in _comm_jobs(plan)] == ["hcom_allGather_", "hcom_allReduce_", "hcom_alltoallv_",
                                                    "hcom_reduceScatter_"]
    plan = run_workflow(workdir, dry_run=True, config={"workload": {"enabled": False}, "comm": {"enabled": False}})
    assert _comm_jobs(plan) == []


def test_a_collective_csv_is_built_by_torchrun_and_rebuilt_when_its_code_changes(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    target = f"data/CPU/gloo/torch{installed_torch_version()}/all_reduce.csv"
    config = {"workload": {"enabled": False}, "comm": QUICK}
    run_workflow(workdir, [target], config=config)
    frame = pd.read_csv(workdir / target, dtype=str, keep_default_na=False)
    assert frame["message_bytes"].tolist() == ["1024", "4096"]
    assert set(frame["op"]) == {"all_reduce"} and set(frame["sample_count"]) == {"3"}
    assert set(frame["device"]) == {"CPU"} and set(frame["grid_shape"]) == {"1x2"}
    assert (workdir / "logs" / "comm" / "CPU" / "gloo").is_dir()

    assert _comm_jobs(run_workflow(workdir, [target], dry_run=True, config=config)) == []

    # The comm report rules: the bandwidth plot of the collection, and its alignment with a reference in which
    # one point took twice as long (the rest is this run's own numbers, so they agree exactly).
    reference = workdir / "reference"
    reference.mkdir()
    frame.loc[1, "Duration(us)"] = f"{float(frame.loc[1, 'Duration(us)']) * 2:.3f}"
    frame.to_csv(reference / "all_reduce.csv", index=False)
    reports = f"reports/CPU/gloo/torch{installed_torch_version()}"
    report_config = {**config, "comm": {**QUICK, "ops": ["all_reduce"], "reference": "reference"}}
    assert sorted(rule for rule, _ in run_workflow(workdir, dry_run=True, config=report_config)
                  if rule.startswith("comm")) == ["comm_alignment", "comm_bandwidth_plot"]
    run_workflow(workdir, [f"{reports}/busbw.png", f"{reports}/alignment.csv"], config=report_config)
    assert (workdir / reports / "busbw.png").read_bytes()[:4] == b"\x89PNG"
    assert "| CPU | event | all_reduce | 2 | 4KiB |" in (workdir / reports / "busbw_largest_messages.md").read_text()
    alignment = pd.read_csv(workdir / reports / "alignment.csv", dtype=str, keep_default_na=False)
    assert alignment["status"].tolist() == ["agrees", "faster"]
    assert alignment["ratio"].tolist() == ["1.0000", "0.5000"]
    assert (workdir / reports / "alignment.txt").read_text().startswith("2 points compared: 1 agree, 0 slower, "
                                                                         "1 faster")

    with open(workdir / "opperf" / "comm" / "timing.py", "a") as handle:
        handle.write("# edited: a timing change must re-collect the collective CSVs\n")
    assert [job[3] for job in _comm_jobs(run_workflow(workdir, [target], dry_run=True, config=config))] == [
        "all_reduce"]
