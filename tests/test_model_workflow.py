"""A database for the user's own model, built by the workflow: a transformers config.json as the workload and as
the grid's target, its queries over a scenario space of config/scenarios.yaml the only generated rows, replayed,
checked end to end and predicted, through Snakemake's own API on the cpu back end."""

from __future__ import annotations

import json

import pytest
import yaml

from snakemake_api import REPO, copy_workflow, planned_rules, run_workflow

pytest.importorskip("transformers")
pytestmark = pytest.mark.workflow

CONFIG_JSON = "config/my_model.json"
SPACE = {"description": "the test's space", "prefill_tokens": [8, 16], "decode_batches": [1, 2],
         "decode_contexts": [16], "tp_sizes": [1]}


def model_config() -> dict:
    return {"workload": {"model": CONFIG_JSON, "prefill_lengths": [8], "decode_steps": 1, "decode_context": 16,
                         "decode_batch_sizes": [1], "num_layers": 1, "profile_iterations": 1},
            "grid": {"target_models": {"cpu": [CONFIG_JSON]}, "consumer_queries": True, "consumer_dtype": "float32",
                     "scenario_space": "test", "queries_only": True},
            "replay": {"repeat_count": 3, "warmup_count": 1},
            "predict": {"scenarios": {"cpu": ["prefill:16", "decode:2x16", "prefill:12"]}},
            "comm": {"enabled": False}}


def workflow_with_model(where):
    """A copy of the workflow holding the tiny dense config.json and the small scenario space `test`."""
    workdir = copy_workflow(where)
    (workdir / CONFIG_JSON).write_text((REPO / "tests" / "data" / "workload" / "tiny_mistral.json").read_text())
    scenarios = workdir / "config" / "scenarios.yaml"
    spaces = yaml.safe_load(scenarios.read_text())
    spaces["spaces"]["test"] = SPACE
    scenarios.write_text(yaml.safe_dump(spaces, sort_keys=False))
    return workdir


def test_the_workflow_builds_checks_and_predicts_a_database_for_a_transformers_config(tmp_path):
    workdir = workflow_with_model(tmp_path / "wf")
    config = model_config()
    run_workflow(workdir, config=config)

    (database,) = (workdir / "data" / "CPU" / "torch").iterdir()
    manifest = json.loads(next((workdir / "results" / "workload").rglob("workload.json")).read_text())
    assert manifest["source"] == "transformers" and manifest["config"]["num_hidden_layers"] == 1
    assert manifest["plan"]["decode_batch_sizes"] == [1]
    # Queries only: the generated rows are the model's queries the profile did not run (decode batch 2), none
    # from grid.yaml's patterns.
    mm = (database / "layouts" / "mm.csv").read_text().splitlines()
    generated = [line for line in mm if ",generated," in line]
    assert generated and all("aten.mm.default" in line for line in generated)
    assert any(line.startswith('eager,CPU,"""2,64;64,') for line in generated)
    # The query's own op maps to its type even where the runtime's CSV keeps a profiled row of its key.
    mappings = yaml.safe_load((database / "op_mapping.yaml").read_text())["operator_mappings"]
    assert mappings["aten.arange.default"]["kernel_type"] == "arange"
    check = (workdir / "logs" / "database").rglob("check.log")
    assert "none falls back to roofline" in next(check).read_text()
    predictions = json.loads(next((workdir / "reports").rglob("predictions.json")).read_text())
    assert predictions["model"] == "hf_my_model"
    steps = {s["name"]: s for s in predictions["scenarios"]}
    assert set(steps) == {"prefill:16", "decode:2x16", "prefill:12"}
    # Inside the space: every query is in the database. Between its points: most of the step interpolates.
    assert all(steps[s]["predicted_us"] > 0 and steps[s]["status_time_share"]["MISS"] == 0
               for s in ("prefill:16", "decode:2x16"))
    assert steps["prefill:12"]["status_time_share"]["INTERPOLATED"] > 0.5

    assert run_workflow(workdir, dry_run=True, config=config) == []
    # The model's config.json is an input: editing it re-profiles and re-grids the database.
    (workdir / CONFIG_JSON).write_text((workdir / CONFIG_JSON).read_text().replace('"vocab_size": 256',
                                                                                     '"vocab_size": 320'))
    plan = set(planned_rules(run_workflow(workdir, dry_run=True, config=config)))
    assert {"profile_workload", "generate_shape_grid", "predict_steps"} <= plan


def test_a_second_models_database_never_lands_in_the_demos_folder(tmp_path):
    """The workflow's database of a user's model is {stack}_{model}, beside the demo's {stack}, never in it."""
    from opperf.versions import cpu_version_dir

    workdir = workflow_with_model(tmp_path / "wf")

    def cpu_databases(config):
        plan = run_workflow(workdir, dry_run=True, config=config)
        return {wildcards["version_dir"] for _, wildcards in plan if wildcards.get("device") == "CPU"}

    assert cpu_databases({"comm": {"enabled": False}}) == {cpu_version_dir()}
    assert cpu_databases(model_config()) == {f"{cpu_version_dir()}_hf_my_model"}
    # workload.version_dir names the stack (a submit host plans with it): the model's name still follows it.
    stack = {"workload": {**model_config()["workload"], "version_dir": cpu_version_dir()}}
    assert cpu_databases({**model_config(), **stack}) == {f"{cpu_version_dir()}_hf_my_model"}


@pytest.mark.parametrize("change, messages", [
    ({"grid": {"consumer_queries": False, "queries_only": True}},
     ["field 'grid.queries_only': needs grid.consumer_queries: true"]),
    ({"grid": {"consumer_queries": True, "scenario_space": "nowhere"}},
     ["field 'grid.scenario_space': ", "field 'spaces.nowhere': no scenario space 'nowhere' (spaces: default, dense)"]),
    ({"workload": {"model": "config/missing.json"}},
     ["field 'workload.model': config/missing.json: cannot read the model config: No such file or directory"]),
    ({"workload": {"kv_cache": "paged"}},
     ["field 'workload.kv_cache': sets how a transformers model runs (workload.model a config.json); the "
      "reference decoder 'opperf-tiny' has no such setting"]),
])
def test_a_bad_model_or_space_stops_the_workflow_naming_the_key(tmp_path, change, messages):
    workdir = copy_workflow(tmp_path / "wf")
    with pytest.raises(Exception) as raised:
        run_workflow(workdir, dry_run=True, config={"comm": {"enabled": False}, **change})
    assert all(message in str(raised.value) for message in messages), str(raised.value)
