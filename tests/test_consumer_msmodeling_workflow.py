"""msmodeling's own runner reads a database the workflow built from its own queries: the grid records a transformers
config.json model's queries with msmodeling's runner (grid.consumer_recorder), the rows replay on the cpu back end,
the database keeps who recorded them (op_mapping.yaml's opperf.consumer_queries) and a DeviceProfile of its device,
and msmodeling's unchanged CLI, run through opperf's launcher at the scenario space's points and between them,
misses nothing in its own account (m1 hit rate 1.0) and answers no op that runs device work as zero_cost.

The workflow test needs msmodeling's checkout (`$OPPERF_MSMODELING_DIR`, else the pinned copy in
../shared/msmodeling) and its Python dependencies (the `msmodeling` extra, part of `.[test]`); elsewhere it skips and
says why. The recorder's choice is tested without it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from opperf.consumer import recorder
from opperf.consumer.msmodeling_env import find_msmodeling, run_cli
from opperf.consumer.recorder import choose_recorder
from opperf.errors import OpperfError
from snakemake_api import REPO, copy_workflow, run_workflow

INSTALL = find_msmodeling()
NEEDS_MSMODELING = pytest.mark.skipif(INSTALL is None, reason="no msmodeling checkout: set OPPERF_MSMODELING_DIR or "
                                                              "lay the pinned copy in ../shared/msmodeling")
MODELS = REPO / "config" / "models.yaml"
CONFIG_JSON = "config/my_model.json"
SPACE = {"description": "the acceptance test's space", "prefill_tokens": [16, 64], "decode_batches": [2, 4],
         "decode_contexts": [256, 512], "tp_sizes": [1]}
# Scenarios on the space's points and between them (each axis between two points), as msmodeling's CLI takes them.
ON_AND_BETWEEN_THE_POINTS = {
    "decode:4x512": ["--num-queries", "4", "--query-length", "1", "--context-length", "512", "--decode"],
    "prefill:40": ["--num-queries", "1", "--query-length", "40"],
    "decode:3x384": ["--num-queries", "3", "--query-length", "1", "--context-length", "384", "--decode"]}


def test_auto_takes_msmodeling_for_config_json_models_and_opperfs_recorder_for_models_yaml_names(monkeypatch):
    monkeypatch.setattr(recorder, "msmodeling_import_error", lambda python, directory: None)
    tiny = str(REPO / "tests" / "data" / "workload" / "tiny_mistral.json")
    if INSTALL is None:
        pytest.skip("no msmodeling checkout to find")
    choice = choose_recorder("auto", [tiny, "opperf-tiny"], MODELS)
    assert choice.recorder == "msmodeling" and choice.install == INSTALL
    assert choice.by_model == {tiny: "msmodeling", "opperf-tiny": "transformers"}
    assert choice.reason == ("grid.consumer_recorder: auto; opperf-tiny: a config/models.yaml reference decoder, not "
                             "a transformers config msmodeling builds")
    assert choose_recorder("auto", ["opperf-tiny"], MODELS).by_model == {"opperf-tiny": "transformers"}
    assert choose_recorder("transformers", [tiny], MODELS).by_model == {tiny: "transformers"}
    # msmodeling's runner builds in float16: its rows are bfloat16, so auto keeps opperf's recorder for float32.
    float32 = choose_recorder("auto", [tiny], MODELS, "float32")
    assert (float32.recorder, float32.by_model) == ("transformers", {tiny: "transformers"})
    with pytest.raises(OpperfError, match="field 'grid.consumer_recorder': grid.consumer_dtype is float32; "):
        choose_recorder("msmodeling", [tiny], MODELS, "float32")


def test_without_a_usable_msmodeling_auto_says_why_and_msmodeling_is_refused(monkeypatch):
    tiny = str(REPO / "tests" / "data" / "workload" / "tiny_mistral.json")
    monkeypatch.setattr(recorder, "find_msmodeling", lambda directory=None: None)
    choice = choose_recorder("auto", [tiny], MODELS)
    assert (choice.recorder, choice.install) == ("transformers", None)
    assert choice.reason == ("auto: no msmodeling checkout (set OPPERF_MSMODELING_DIR or lay it in "
                             "../shared/msmodeling)")
    assert "consumer queries recorded by opperf's transformers recorder: " in choice.describe()
    with pytest.raises(OpperfError, match=r"field 'grid.consumer_recorder': no msmodeling checkout"):
        choose_recorder("msmodeling", [tiny], MODELS)
    # A checkout whose Python cannot import msmodeling's runner: auto says which error.
    if INSTALL is not None:
        monkeypatch.setattr(recorder, "find_msmodeling", lambda directory=None: INSTALL)
        monkeypatch.setattr(recorder, "msmodeling_import_error",
                            lambda python, directory: "ModuleNotFoundError: No module named 'optree'")
        choice = choose_recorder("auto", [tiny], MODELS)
        assert choice.recorder == "transformers"
        assert choice.reason.endswith("cannot import tensor_cast.core.model_runner from "
                                      f"{INSTALL.directory}: ModuleNotFoundError: No module named 'optree'")


def test_the_workflow_refuses_msmodeling_for_float32_queries_naming_the_key(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    config = {"comm": {"enabled": False},
              "grid": {"consumer_queries": True, "consumer_dtype": "float32", "consumer_recorder": "msmodeling"}}
    with pytest.raises(Exception) as raised:
        run_workflow(workdir, dry_run=True, config=config)
    assert ("field 'grid.consumer_recorder': msmodeling's runner builds in float16, which its runtime spells as "
            "bfloat16: its rows are bfloat16, not grid.consumer_dtype float32") in str(raised.value)


def test_the_grid_records_who_recorded_the_queries_and_the_database_keeps_it_with_a_device_profile(tmp_path):
    """scripts/generate_shape_grid.py writes consumer_queries.json (here opperf's recorder: no msmodeling needed);
    scripts/build_database.py keeps it in op_mapping.yaml's opperf block and writes msmodeling_device.py."""
    import shutil

    parsed, rows = tmp_path / "parsed", tmp_path / "rows"
    parsed.mkdir()
    (parsed / "kernel_types.txt").write_text("")
    (tmp_path / "scenarios.yaml").write_text(yaml.safe_dump({"spaces": {"t": {
        "prefill_tokens": [4], "decode_batches": [2], "decode_contexts": [8], "tp_sizes": [1]}}}))
    done = subprocess.run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(parsed),
                           "--output-dir", str(rows), "--device", "CPU", "--consumer-models",
                           "tests/data/workload/tiny_mistral.json", "--scenarios", str(tmp_path / "scenarios.yaml"),
                           "--scenario-space", "t", "--queries-only", "--consumer-dtype", "float32",
                           "--consumer-recorder", "transformers"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("consumer queries recorded by opperf's transformers recorder: tests/data/workload/tiny_mistral.json "
            "(grid.consumer_recorder: transformers)") in done.stderr
    record = {"recorded_by": {"hf_tiny_mistral": "transformers"}, "scenario_space": "t"}
    assert json.loads((rows / "consumer_queries.json").read_text()) == record
    summary = pd.read_csv(rows / "grid_summary.tsv", sep="\t", keep_default_na=False)
    assert set(summary["consumer_recorder"]) == {"transformers"}

    # The database build keeps the record; a cpu database gets msmodeling's DeviceProfile of its device.
    replayed = tmp_path / "replayed"
    shutil.copytree(REPO / "tests" / "data" / "database" / "cpu_replayed", replayed)
    msmodeling_record = {"recorded_by": {"hf_my_model": "msmodeling"}, "scenario_space": "dense",
                         "msmodeling_commit": "84fec853d6708256ca4fecf143d8b656a3a3496e",
                         "msmodeling_commit_source": "SNAPSHOT.md"}
    (replayed / "consumer_queries.json").write_text(json.dumps(msmodeling_record))
    database = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    done = subprocess.run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(replayed),
                           "--device", "CPU", "--output", str(database)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    document = yaml.safe_load((database / "op_mapping.yaml").read_text())
    assert document["opperf"]["consumer_queries"] == msmodeling_record
    profile = (database / "msmodeling_device.py").read_text()
    assert "NAME = 'GENERIC_HOST_CPU'" in profile and str(tmp_path) not in profile and str(REPO) not in profile
    # A record that is no record stops the build in one line, leaving no database.
    (replayed / "consumer_queries.json").write_text('{"recorded_by": "msmodeling"}')
    broken = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu_broken"
    done = subprocess.run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(replayed),
                           "--device", "CPU", "--output", str(broken)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert (done.returncode, done.stderr) == (2, f"error: {replayed / 'consumer_queries.json'}: not a consumer "
                                                 "queries' record: no `recorded_by` mapping\n")
    assert not broken.exists()
    # Without a record, no consumer_queries key: the database says nothing it does not know.
    (replayed / "consumer_queries.json").unlink()
    other = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu_other"
    assert subprocess.run([sys.executable, "scripts/build_database.py", "directory", "--rows-dir", str(replayed),
                           "--device", "CPU", "--output", str(other)], cwd=REPO, timeout=300).returncode == 0
    assert "consumer_queries" not in yaml.safe_load((other / "op_mapping.yaml").read_text())["opperf"]
    # The workflow's form: the file is named as the launcher expects it.
    done = subprocess.run([sys.executable, "scripts/build_database.py", "msmodeling-device", "--device", "CPU",
                           "--output", str(tmp_path / "device.py")], cwd=REPO, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (2, f"error: {tmp_path / 'device.py'}, field '--output': must be named "
                                                 "msmodeling_device.py (the file msmodeling's launcher loads)\n")


def msmodeling_config() -> dict:
    return {"sources": "config/no_sources.tsv",
            # The workload profiled as msmodeling's runner runs it (paged KV cache), as benchmarks/e2e_prediction.py
            # builds its databases; its power is what replay.unprofiled_power: workload reads (cuda only).
            "workload": {"model": CONFIG_JSON, "dtype": "bfloat16", "prefill_lengths": [8], "decode_steps": 1,
                         "decode_context": 16, "decode_batch_sizes": [1], "num_layers": 1, "profile_iterations": 1,
                         "kv_cache": "paged"},
            "grid": {"target_models": {"cpu": [CONFIG_JSON]}, "consumer_queries": True, "consumer_dtype": "bfloat16",
                     "scenario_space": "msmodeling", "queries_only": True, "consumer_recorder": "msmodeling"},
            "replay": {"repeat_count": 3, "warmup_count": 1, "unprofiled_power": "workload"},
            "predict": {"scenarios": ["prefill:40", "decode:3x384"]},     # runner auto: msmodeling's own
            "comm": {"enabled": False}}


def _positive_durations(database: Path, kernel_type: str) -> list[float]:
    path = database / "layouts" / f"{kernel_type}.csv"
    if not path.is_file():
        return []
    rows = pd.read_csv(path, dtype=str, keep_default_na=False)
    durations = pd.to_numeric(rows.get("Average Duration(us)", pd.Series(dtype=str)), errors="coerce")
    return [float(d) for d in durations if d > 0]


@NEEDS_MSMODELING
@pytest.mark.workflow
def test_msmodelings_own_cli_misses_nothing_on_the_database_the_workflow_built_from_its_queries(tmp_path):
    workdir = copy_workflow(tmp_path / "wf")
    (workdir / CONFIG_JSON).write_text((REPO / "tests" / "data" / "workload" / "tiny_mistral.json").read_text())
    scenarios = workdir / "config" / "scenarios.yaml"
    spaces = yaml.safe_load(scenarios.read_text())
    spaces["spaces"]["msmodeling"] = SPACE
    scenarios.write_text(yaml.safe_dump(spaces, sort_keys=False))
    (workdir / "config" / "no_sources.tsv").write_text("device\tstack\tversion_dir\tpath\tnote\n")
    config = msmodeling_config()
    run_workflow(workdir, config=config)

    (database,) = (workdir / "data" / "CPU" / "torch").iterdir()
    document = yaml.safe_load((database / "op_mapping.yaml").read_text())
    assert document["opperf"]["consumer_queries"] == {
        "recorded_by": {"hf_my_model": "msmodeling"}, "scenario_space": "msmodeling",
        "msmodeling_commit": INSTALL.commit, "msmodeling_commit_source": INSTALL.commit_source}
    assert document["opperf"]["dtype"] == "bfloat16"
    assert document["operator_mappings"]["tensor_cast.attention.default"]["kernel_type"] == "PagedAttention"
    # A row per distinct attention call of the space (2 prefills, 2 x 2 decode steps) and where msmodeling's lookup
    # looks between them: prefill at every 16 tokens (32, 48 besides the space's 16, 64), decode at every batch from
    # 2 to 4 at both contexts (batch 3 besides the space's 2 and 4).
    attention = pd.read_csv(database / "layouts" / "PagedAttention.csv", dtype=str)
    assert sorted(zip(attention["Runtime batch_size"].astype(int), attention["Runtime avg_seq_len"].astype(int))) == [
        (1, 16), (1, 32), (1, 48), (1, 64), (2, 257), (2, 513), (3, 257), (3, 513), (4, 257), (4, 513)]
    # The cache write is looked up by its new keys alone: a row per token count of the space.
    writes = pd.read_csv(database / "layouts" / "ReshapeAndCache.csv", dtype=str)
    assert sorted(int(shapes.strip("\"").split(",")[0]) for shapes in writes["Input Shapes"]) == [2, 4, 16, 64]
    summary = workdir / "results" / "CPU" / "torch" / database.name / "grid" / "grid_summary.tsv"
    recorded_by = dict(pd.read_csv(summary, sep="\t", keep_default_na=False)[["kernel_type", "consumer_recorder"]]
                       .itertuples(index=False))
    assert recorded_by["PagedAttention"] == recorded_by["index_select"] == "msmodeling"
    check = next((workdir / "logs" / "database").rglob("check.log")).read_text()
    assert "as msmodeling's own data sources answer them" in check and "none falls back to roofline" in check
    # The check asks msmodeling's data sources between the space's points too, and says which rule answered.
    assert ("at the space's points and 6 scenarios between them (prefill:40, decode:3x256, decode:3x512, "
            "decode:2x384, …)") in check
    assert "answered by the runtime's rule: exact " in check and "padded " in check and "interpolated " in check
    assert run_workflow(workdir, dry_run=True, config=config) == []

    model_dir = tmp_path / "my_model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((workdir / CONFIG_JSON).read_text())
    profile = database / "msmodeling_device.py"
    mappings = document["operator_mappings"]
    step_us = {}
    for name, scenario in ON_AND_BETWEEN_THE_POINTS.items():
        metrics, trace = tmp_path / f"{name.replace(':', '_')}.json", tmp_path / f"{name.replace(':', '_')}.trace"
        done = run_cli(INSTALL, profile, [
            "inference", "text-generate", str(model_dir), *scenario, "--device", document["device"],
            "--num-hidden-layers-override", "2", "--quantize-linear-action", "DISABLED",
            "--performance-model", "profiling", "--profiling-database-path", str(database),
            "--export-empirical-metrics-file", str(metrics), "--chrome-trace-file", str(trace)], timeout_s=300)
        step_us[name] = float(re.search(r"^\[empirical\] Execution time: (\S+) s$", done.stdout, re.M)[1]) * 1e6
        report = json.loads(metrics.read_text())
        assert (report["m1"]["m1_miss"], report["m1"]["m1_raw_op_count_hr"]) == (0, 1.0), (name, report["misses"])
        assert report["m1"]["m1_total"] > 40
        # The ops answered zero_cost or accepted_miss (from the runner's own trace; the metrics count them):
        # none of them runs device work when replayed.
        events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
        free = {e["name"].removeprefix("torch.ops.") for e in events if e["args"].get("zero_cost") == "True"}
        assert report["m2"]["m2_fused_total"] - report["m3"]["m3_fused_total_no_zc"] == len(free), name
        for op in free:
            mapping = mappings[op]
            own_type = op.split(".")[1]
            assert not any(_positive_durations(database, kernel_type)
                           for kernel_type in {mapping.get("kernel_type"), own_type} if kernel_type), (name, op)
        # TensorCast's own ops answered from rows: measured at the points, interpolated or padded between them.
        assert {"tensor_cast.attention.default", "tensor_cast.reshape_and_cache.default"} <= {
            e["name"].removeprefix("torch.ops.") for e in events if e["args"].get("source") in ("MEASURED",
                                                                                                "INTERPOLATED")}

    # predict.py gives way to msmodeling's own runner where it is present: its step time, its account.
    out = tmp_path / "predictions.json"
    done = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(database), "--transformers-config",
                           str(model_dir), "--num-layers", "2", "--scenario", "decode:3x384", "--json", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("predicted by msmodeling's own runner, msmodeling ")
    predicted = json.loads(out.read_text())
    assert (predicted["runner"], predicted["msmodeling_commit"]) == ("msmodeling", INSTALL.commit)
    for scenario in predicted["scenarios"]:
        assert scenario["predicted_us"] == pytest.approx(step_us[scenario["name"]], rel=1e-3), scenario["name"]
        assert (scenario["m1_hit_rate"], scenario["misses"], scenario["answered_share"]) == (1.0, [], 1.0)
        assert scenario["by_op"]["tensor_cast.attention.default"]["calls"] == 2
    # The workflow's own predictions (predict.runner auto) are msmodeling's runner's, at the model's own depth.
    workflow = json.loads(next((workdir / "reports" / "CPU" / "torch").rglob("predictions.json")).read_text())
    assert workflow["runner"] == "msmodeling" and [s["name"] for s in workflow["scenarios"]] == ["prefill:40",
                                                                                               "decode:3x384"]
    assert all(s["m1_hit_rate"] == 1.0 for s in workflow["scenarios"])
    # Told to, opperf's model answers instead, and says so.
    done = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(database), "--transformers-config",
                           str(model_dir), "--num-layers", "2", "--scenario", "prefill:40", "--runner", "opperf"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[1] == "answered by opperf's model of msmodeling's runtime (--runner opperf)"
