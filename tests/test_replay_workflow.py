"""The replay stage in the workflow (Snakemake API, temporary copy): every row replayed, one edited
kernel definition re-runs that kernel's replay only."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from snakemake_api import run_workflow, tiny_cpu_replay_workflow

pytestmark = pytest.mark.workflow

DATABASE = ("CPU", "torch", "torch{}_cpu")


def test_replay_fills_every_row_and_an_edited_definition_reruns_only_its_kernel(tmp_path):
    workdir, config, root = tiny_cpu_replay_workflow(tmp_path / "wf")
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
