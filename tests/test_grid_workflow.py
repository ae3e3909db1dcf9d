"""The grid rule reruns when grid.yaml, models.yaml or the grid config keys change, and not otherwise."""

from __future__ import annotations

import pytest

from snakemake_api import copy_workflow, planned_rules, run_workflow

pytestmark = pytest.mark.workflow

A3 = "vllm0.18.0_torch2.9.0_cann8.5"
A3_SOURCE = "resources/profiles/A3_vllm0.18.0_torch2.9.0_cann8.5/kernel_details.csv"
GRID_AND_DOWNSTREAM = {"generate_shape_grid", "database_kernel", "database_op_mapping", "database_complete",
                       "database_check"}


def a3_config(workdir, **grid) -> dict:
    (workdir / "config" / "grid_sources.tsv").write_text(
        f"device\tstack\tversion_dir\tpath\nA3\tvllm_ascend\t{A3}\t{A3_SOURCE}\n")
    return {"sources": "config/grid_sources.tsv", "workload": {"enabled": False}, "comm": {"enabled": False},
            "replay": {"backends": []}, "grid": {"target_models": ["Qwen3-32B"], "rows": 200, **grid}}


def rerun_rules(workdir, config) -> set[str]:
    return set(planned_rules(run_workflow(workdir, dry_run=True, config=config))) - {"all"}


def test_grid_reruns_on_its_inputs_and_params_only(tmp_path):
    (tmp_path / "wf").mkdir()
    workdir = copy_workflow(tmp_path / "wf")
    config = a3_config(workdir)
    run_workflow(workdir, config=config)
    database = workdir / "data" / "A3" / "vllm_ascend" / A3
    matmul = (database / "MatMulV2.csv").read_text()
    # The row cap keeps whole buckets (an (N, K) pair with all its M values) up to 200 rows.
    assert 0 < matmul.count(",generated") <= 200 and matmul.count(",profiled") == 1
    assert run_workflow(workdir, dry_run=True, config=config) == []

    # A config key of another stage (the workload is off) changes nothing here.
    assert rerun_rules(workdir, {**config, "workload": {"enabled": False, "decode_steps": 9}}) == set()
    # Target models, rows and seed are params: changing one re-runs the grid and what it feeds, not the parse.
    for change in ({"target_models": ["Qwen3-32B", "dsv3"]}, {"rows": 201}, {"seed": 1}):
        assert rerun_rules(workdir, {**config, "grid": {**config["grid"], **change}}) == GRID_AND_DOWNSTREAM
    # Target models per back end / device: the A3 (npu) database follows its own entry only.
    per_backend = {**config["grid"], "target_models": {"cpu": ["opperf-tiny"], "npu": ["Qwen3-32B"]}}
    assert rerun_rules(workdir, {**config, "grid": per_backend}) == set()
    per_backend["target_models"] = {"cpu": ["Llama-3-70B"], "npu": ["Qwen3-32B"]}
    assert rerun_rules(workdir, {**config, "grid": per_backend}) == set()
    per_backend["target_models"] = {"A3": ["dsv3"], "npu": ["Qwen3-32B"]}
    assert rerun_rules(workdir, {**config, "grid": per_backend}) == GRID_AND_DOWNSTREAM
    # The device catalog reaches the grid as params: another device's entry does not re-run it, the
    # database device's memory (its HBM budget) does.
    devices = workdir / "config" / "devices.yaml"
    catalog = devices.read_text()
    devices.write_text(catalog.replace("memory_bandwidth_gbps: 4800", "memory_bandwidth_gbps: 4900"))
    assert "generate_shape_grid" not in rerun_rules(workdir, config)
    devices.write_text(catalog.replace("memory_gb: 64          # per die", "memory_gb: 48          # per die"))
    assert "generate_shape_grid" in rerun_rules(workdir, config)
    devices.write_text(catalog)
    # Editing models.yaml or grid.yaml re-runs the grid and downstream only.
    for edited in ("config/models.yaml", "config/grid.yaml", "config/density_standard.yaml"):
        path = workdir / edited
        original = path.read_text()
        path.write_text(original + "\n# edited\n")
        assert rerun_rules(workdir, config) == GRID_AND_DOWNSTREAM, edited
        path.write_text(original)
