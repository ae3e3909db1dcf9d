"""What a user sees on the command line when a target names a kernel type or a device that does not exist:
one line naming the target, what is wrong and the valid choices (snakemake's own CLI, in a workflow copy)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from snakemake_api import copy_workflow

pytestmark = pytest.mark.workflow

A3 = "data/A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5"
OFFLINE = "workload: {enabled: false}\ncomm: {enabled: false}\nreplay: {backends: []}\n"


def snakemake(workdir, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "--configfile", "offline.yaml", *args], cwd=workdir,
                          capture_output=True, text=True)


@pytest.fixture
def workdir(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / "offline.yaml").write_text(OFFLINE)
    return workdir


def lines_naming(output: str, text: str) -> list[str]:
    return [line.strip() for line in output.splitlines() if text in line]


def test_a_typod_kernel_type_stops_with_the_closest_and_all_kernel_types(workdir):
    target = f"{A3}/MatMulV9.csv"
    expected = (f"{target}: 'MatMulV9' is not a kernel type of database A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5 "
                "(closest: MatMulV3, MatMulV2; all 5: Add, FlashAttentionScore, FlashAttentionScoreGrad, MatMulV2, "
                "MatMulV3)")
    # First run: the kernel types are known once the parse checkpoint has run; then it stops, nothing else runs.
    result = snakemake(workdir, "--cores", "1", target)
    assert result.returncode == 1
    assert lines_naming(result.stdout + result.stderr, "is not a kernel type") == [expected]
    assert not (workdir / "data").exists()
    assert not (workdir / "results" / "A3" / "vllm_ascend" / "vllm0.18.0_torch2.9.0_cann8.5" / "grid").exists()
    # Once parsed, even a dry run stops at planning with the same line.
    result = snakemake(workdir, "-n", target)
    assert result.returncode == 1
    assert lines_naming(result.stdout + result.stderr, "is not a kernel type") == [expected]
    # The right name plans as before.
    assert snakemake(workdir, "-n", f"{A3}/MatMulV2.csv").returncode == 0


@pytest.mark.parametrize("target, expected", [
    ("data/X9/torch/torch2.13.0_cpu/mm.csv",
     "data/X9/torch/torch2.13.0_cpu/mm.csv: 'X9' is not a device key of config/devices.yaml "
     "(keys: A2, A3, CPU, H100, H200); add it to config/devices.yaml to build a database for it"),
    ("reports/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5/summary.json",
     "reports/ATLAS_800_A3_752T_128G_DIE/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5/summary.json: "
     "'ATLAS_800_A3_752T_128G_DIE' is not a device key of config/devices.yaml (keys: A2, A3, CPU, H100, H200); "
     "it is the full name of 'A3': paths use the key"),
])
def test_an_unknown_device_stops_with_the_catalogs_keys(workdir, target, expected):
    result = snakemake(workdir, "-n", target)
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert lines_naming(output, "is not a device key") == [expected]
    assert "MissingRuleException" not in output


def test_a_typod_version_dir_stops_with_the_closest_database(workdir):
    """A version_dir the config builds no database for (torch2.13_cpu for torch2.13.0_cpu) names the closest it
    does, and where that one comes from (the workload's database, or a row of config/sources.tsv)."""
    from opperf.versions import cpu_version_dir

    a3 = "A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5"
    result = snakemake(workdir, "-n", "data/A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.6/MatMulV2.csv")
    assert result.returncode == 1
    assert lines_naming(result.stdout + result.stderr, "is not a database of this config") == [
        "A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.6 is not a database of this config (closest: "
        f"vllm0.18.0_torch2.9.0_cann8.5 (from config/sources.tsv); all 1: {a3}); a new database needs its raw "
        "profile registered: add a row to config/sources.tsv"]

    (workdir / "with_workload.yaml").write_text("comm: {enabled: false}\n")
    version_dir = cpu_version_dir()                      # torch2.13.0_cpu
    typo = version_dir[:-6] + version_dir[-4:]            # torch2.13_cpu
    result = subprocess.run([sys.executable, "-m", "snakemake", "--configfile", "with_workload.yaml", "-n",
                             f"data/CPU/torch/{typo}/mm.csv"], cwd=workdir, capture_output=True, text=True)
    assert result.returncode == 1
    assert lines_naming(result.stdout + result.stderr, "is not a database of this config") == [
        f"CPU/torch/{typo} is not a database of this config (closest: {version_dir} (the workload's); all 2: "
        f"{a3}, CPU/torch/{version_dir}); a new database needs its raw profile registered: add a row to "
        "config/sources.tsv"]
    assert "no raw profile is registered" not in result.stdout + result.stderr
