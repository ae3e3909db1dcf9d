"""The replay stage in the workflow (Snakemake API, temporary copy): every row replayed, one edited
kernel definition re-runs that kernel's replay only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from snakemake_api import copy_workflow, run_workflow

pytestmark = pytest.mark.workflow

TRACE = Path(__file__).parent / "data" / "replay" / "tiny_cpu" / "trace.json"
DATABASE = ("CPU", "torch", "torch{}_cpu")


def test_replay_fills_every_row_and_an_edited_definition_reruns_only_its_kernel(tmp_path):
    (tmp_path / "wf").mkdir()
    workdir = copy_workflow(tmp_path / "wf")
    from opperf.versions import cpu_version_dir

    version_dir = cpu_version_dir()
    (workdir / "resources" / "tiny_cpu").mkdir(parents=True)
    shutil.copy(TRACE, workdir / "resources" / "tiny_cpu" / "trace.json")
    (workdir / "config" / "replay_sources.tsv").write_text(
        f"device\tstack\tversion_dir\tpath\nCPU\ttorch\t{version_dir}\tresources/tiny_cpu/trace.json\n")
    config = {"sources": "config/replay_sources.tsv", "workload": {"enabled": False}, "comm": {"enabled": False},
              "grid": {"enabled": False}, "replay": {"backends": ["cpu"], "repeat_count": 2, "warmup_count": 1}}
    root = f"CPU/torch/{version_dir}"
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
    # The report waited for every database job of its database: all kernel CSVs, op_mapping and manifest.
    timings = json.loads((workdir / report).read_text())["stage_timings_s"]
    assert timings["database"]["jobs"] == len(kernels) + 2
    assert timings["replay"]["jobs"] == len(kernels)

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
    assert [wildcards["kernel"] for rule, wildcards in plan if rule == "database_kernel"] == ["mm"]
    assert {rule for rule, _ in plan} == {"replay_kernel", "database_kernel", "database_op_mapping",
                                          "database_complete", "replay_report"}
