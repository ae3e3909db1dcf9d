"""Incremental rebuild behaviour, through Snakemake's own Python API, in a temporary copy of the workflow."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from snakemake_api import copy_workflow, planned_rules, run_workflow

pytestmark = pytest.mark.workflow

A3 = "data/A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5"
A3_SOURCE = "resources/profiles/A3_vllm0.18.0_torch2.9.0_cann8.5/kernel_details.csv"
FIXTURE_TYPES = ["Add", "FlashAttentionScore", "FlashAttentionScoreGrad", "MatMulV2", "MatMulV3"]


def write_sources(workdir: Path, rows: list[tuple[str, str, str, str]]) -> str:
    lines = ["device\tstack\tversion_dir\tpath"] + ["\t".join(r) for r in rows]
    (workdir / "config" / "test_sources.tsv").write_text("\n".join(lines) + "\n")
    return "config/test_sources.tsv"


def offline_config(sources: str, **overrides) -> dict:
    """Only the registered profiles (no CPU workload, no collectives): parse → grid → database."""
    config = {"sources": sources, "workload": {"enabled": False}, "comm": {"enabled": False},
              "replay": {"backends": []}}
    config.update(overrides)
    return config


def mtimes(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def workdir(tmp_path):
    return copy_workflow(tmp_path / "wf")


def test_a3_dry_run_plans_parse_and_database_jobs(workdir):
    sources = write_sources(workdir, [("A3", "vllm_ascend", "vllm0.18.0_torch2.9.0_cann8.5", A3_SOURCE)])
    plan = run_workflow(workdir, [f"{A3}/MatMulV2.csv"], dry_run=True, config=offline_config(sources))
    rules = planned_rules(plan)
    assert "parse_profiles" in rules and "database_kernel" in rules
    assert set(rules) <= {"parse_profiles", "generate_shape_grid", "database_kernel"}
    assert ("database_kernel", {"device": "A3", "stack": "vllm_ascend",
                                "version_dir": "vllm0.18.0_torch2.9.0_cann8.5", "kernel": "MatMulV2"}) in plan
    assert not (workdir / "data").exists(), "a dry run must not write anything"


def test_build_then_nothing_then_only_what_changed(workdir):
    v1, v2 = "vllm0.18.0_torch2.9.0_cann8.5", "vllm0.18.0_torch2.9.0_cann8.5_shape_generated"
    # Snakemake 9 compares checksums of inputs under 1 MB instead of their mtimes, so a bare `touch`
    # re-runs only what depends on a larger file; real profiles are. Make this one larger: the
    # fixture's rows 100 times over (same groups, so the same kernel types).
    header, *rows = (workdir / A3_SOURCE).read_text(encoding="utf-8-sig").splitlines()
    second = workdir / "resources" / "second_profile.csv"
    second.write_text("\n".join([header] + rows * 100) + "\n", encoding="utf-8")
    assert second.stat().st_size > 1_000_000
    sources = write_sources(workdir, [("A3", "vllm_ascend", v1, A3_SOURCE),
                                      ("A2", "vllm_ascend", v1, "resources/second_profile.csv")])
    config = offline_config(sources)

    run_workflow(workdir, config=config)
    for device in ("A3", "A2"):
        database = workdir / "data" / device / "vllm_ascend" / v1
        assert sorted(p.stem for p in database.glob("*.csv")) == FIXTURE_TYPES
        assert (database / "op_mapping.yaml").is_file()

    # A second run does nothing.
    assert run_workflow(workdir, dry_run=True, config=config) == []
    before = mtimes(workdir / "data")
    assert run_workflow(workdir, config=config) == []
    assert mtimes(workdir / "data") == before

    # Touching one registered raw profile re-runs that database's jobs only.
    time.sleep(0.01)
    os.utime(second)
    plan = run_workflow(workdir, dry_run=True, config=config)
    assert plan and {w.get("device") for rule, w in plan if rule != "all"} == {"A2"}
    assert "parse_profiles" in planned_rules(plan)
    run_workflow(workdir, config=config)
    after = mtimes(workdir / "data")
    changed = {f for f in after if after[f] != before.get(f)}
    assert changed and all(f.startswith(f"A2/vllm_ascend/{v1}/") for f in changed)

    # A new version_dir builds beside the old one and leaves it untouched.
    sources = write_sources(workdir, [("A3", "vllm_ascend", v1, A3_SOURCE),
                                      ("A2", "vllm_ascend", v1, "resources/second_profile.csv"),
                                      ("A3", "vllm_ascend", v2, A3_SOURCE)])
    config = offline_config(sources)
    plan = run_workflow(workdir, dry_run=True, config=config)
    assert {w.get("version_dir") for rule, w in plan if rule != "all"} == {v2}
    run_workflow(workdir, config=config)
    newest = mtimes(workdir / "data")
    assert all(newest[f] == after[f] for f in after)
    assert sorted(p.stem for p in (workdir / "data" / "A3" / "vllm_ascend" / v2).glob("*.csv")) == FIXTURE_TYPES


def test_editing_a_small_profile_reruns_its_database(workdir):
    """Under 1 MB Snakemake 9 goes by content: an edit re-runs, a bare touch (same bytes) does not."""
    profile = workdir / "resources" / "small.csv"
    profile.write_bytes((workdir / A3_SOURCE).read_bytes())
    sources = write_sources(workdir, [("A3", "vllm_ascend", "vllm0.18.0_torch2.9.0_cann8.5", "resources/small.csv")])
    config = offline_config(sources)
    run_workflow(workdir, config=config)
    os.utime(profile)
    assert run_workflow(workdir, dry_run=True, config=config) == []
    profile.write_text(profile.read_text(encoding="utf-8-sig").replace(",185.504,", ",285.504,"), encoding="utf-8")
    run_workflow(workdir, config=config)
    # (285.504 + 186.823 + 187.724 + 190.544) / 4: the edited duration reached the database (in some row: the
    # runtime's CSV holds its rows largest call first).
    matmul = [line.split(",") for line in (workdir / A3 / "MatMulV2.csv").read_text().splitlines()[1:]]
    assert any("212.64875" in row for row in matmul)


def test_workload_reprofiles_only_when_its_own_model_changes(workdir):
    """The CPU database re-collects when opperf-tiny's dimensions change, not when another model's do."""
    config = {"grid": {"enabled": False}, "replay": {"backends": []}, "comm": {"enabled": False},
              "workload": {"prefill_lengths": [8], "decode_steps": 1, "decode_context": 8}}
    run_workflow(workdir, config=config)
    cpu_databases = list((workdir / "data" / "CPU" / "torch").iterdir())
    assert len(cpu_databases) == 1 and (cpu_databases[0] / "mm.csv").is_file()

    models = workdir / "config" / "models.yaml"
    text = models.read_text()
    models.write_text(text.replace("vocab_size: 151936", "vocab_size: 151937", 1))
    assert models.read_text() != text
    assert run_workflow(workdir, dry_run=True, config=config) == []

    models.write_text(text.replace("intermediate_size: 688", "intermediate_size: 704", 1))
    plan = planned_rules(run_workflow(workdir, dry_run=True, config=config))
    assert "profile_workload" in plan and "parse_profiles" in plan
    assert all(w.get("device") in (None, "CPU") for _, w in run_workflow(workdir, dry_run=True, config=config))


@pytest.mark.parametrize("row, message", [
    (("B200", "vllm_ascend", "vllm0.18.0_torch2.9.0_cann8.5", A3_SOURCE), "line 2, field 'device': 'B200'"),
    (("A3", "vllm_ascend", "latest", A3_SOURCE), "line 2, field 'version_dir'"),
    (("A3", "vllm_ascend", "vllm0.18.0_torch2.9.0_cann8.5", "resources/nowhere.csv"),
     "line 2, field 'path': 'resources/nowhere.csv' does not exist"),
])
def test_bad_sources_sheet_rows_stop_the_workflow_naming_line_and_field(workdir, row, message):
    sources = write_sources(workdir, [row])
    with pytest.raises(Exception, match=message):
        run_workflow(workdir, dry_run=True, config=offline_config(sources))
