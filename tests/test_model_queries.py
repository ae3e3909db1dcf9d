"""The queries of any model over a scenario space, the rows they become, and the prediction a user reads.

A transformers config (run on meta, as TensorCast runs a model) and the reference decoder go through the same path;
a database holding the rows of a scenario space answers a listed scenario EXACT and one between two grid points by
a legal interpolation, and scripts/predict.py says so.
"""

from __future__ import annotations

import json
import os
import math
import subprocess
import sys

import pandas as pd
import pytest
import torch

from conftest import REPO, built_experts
from opperf.contract import INPUT_SHAPES, OUTPUT_SHAPES, parse_shapes
from opperf.consumer.model_queries import (model_queries, model_source, parse_scenario, rank_config, scenario_name,
                                           scenario_tp_sizes)
from opperf.consumer.scenarios import load_scenario_space
from opperf.errors import OpperfError
from opperf.grid.queries import query_rows, record_consumer_queries

pytest.importorskip("transformers")

TINY_QWEN3 = REPO / "benchmarks" / "workloads" / "tiny" / "qwen3.json"
TINY_OLMOE = REPO / "tests" / "data" / "workload" / "tiny_olmoe.json"      # OLMoE: num_experts x intermediate_size
TINY_MISTRAL = REPO / "tests" / "data" / "workload" / "tiny_mistral.json"
MODELS = REPO / "config" / "models.yaml"
SPACE = "spaces:\n  t:\n    prefill_tokens: [8, 32]\n    decode_batches: [2, 4, 8]\n    decode_contexts: [16, 32]\n"


def _ops(recorded) -> dict[str, list]:
    found: dict[str, list] = {}
    for item in recorded:
        found.setdefault(item.query.op_name, []).append(
            ([tuple(t.shape) for t in item.query.inputs], item.calls))
    return found


def test_a_transformers_config_is_queried_as_its_own_code_runs_on_meta():
    """The config's own architecture (qwen3: q/k norms, grouped-query attention) at its own widths: the linear
    layers arrive as mm on [tokens, hidden], attention as the cpu kernel sdpa dispatches to, the KV cache of a
    decode step as the cat of the cached and the new token."""
    config = json.loads(TINY_QWEN3.read_text())
    hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    source = model_source(str(TINY_QWEN3), MODELS)
    assert source.name == "hf_qwen3" and source.depth == config["num_hidden_layers"]
    prefill = _ops(model_queries(source, [parse_scenario("prefill:8", source.name)], dtype=torch.float32,
                                 attention="cpu"))
    layers = config["num_hidden_layers"]
    gemms = dict((tuple(shapes), calls) for shapes, calls in prefill["aten.mm.default"])
    assert gemms[((8, hidden), (hidden, config["intermediate_size"]))] == 2 * layers      # gate and up
    assert gemms[((8, hidden), (hidden, kv_heads * head_dim))] == 2 * layers               # k and v
    assert gemms[((1, hidden), (hidden, config["vocab_size"]))] == 1     # the logits of the last position only
    attention = prefill["aten._scaled_dot_product_flash_attention_for_cpu.default"]
    assert attention == [([(1, heads, 8, head_dim), (1, kv_heads, 8, head_dim), (1, kv_heads, 8, head_dim)],
                          layers)]
    decode = _ops(model_queries(source, [parse_scenario("decode:4x16", source.name)], dtype=torch.float32,
                                attention="cpu"))
    assert ([(4, kv_heads, 16, head_dim), (4, kv_heads, 1, head_dim)], 2 * layers) in decode["aten.cat.default"]
    assert ([(4, hidden), (hidden, config["vocab_size"])], 1) in decode["aten.mm.default"]


def test_the_reference_decoder_goes_through_the_same_path():
    source = model_source("opperf-tiny", MODELS)
    assert source.config is None and source.tp_sizes == (1, 2)
    ops = _ops(model_queries(source, [parse_scenario("prefill:16", source.name, tp=2)], dtype=torch.float32,
                             attention="cpu"))
    # TP 2: 8 heads of 32 -> 4 per rank (the fused QKV 128 + 2 x 64, the output projection from 128), the fused
    # gate/up 2 x 688 -> 688, the down projection from 344.
    gemms = dict((tuple(shapes), calls) for shapes, calls in ops["aten.mm.default"])
    assert {shapes: gemms[shapes] for shapes in (((16, 256), (256, 256)), ((16, 128), (128, 256)),
                                                  ((16, 256), (256, 688)), ((16, 344), (344, 256)))} == {
        ((16, 256), (256, 256)): 2, ((16, 128), (128, 256)): 2, ((16, 256), (256, 688)): 2,
        ((16, 344), (344, 256)): 2}


def test_a_rank_shares_heads_widths_and_vocabulary():
    config = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 12288,
              "moe_intermediate_size": 768, "vocab_size": 151937}
    assert rank_config(config, 8) == {**config, "head_dim": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                                      "intermediate_size": 1536, "moe_intermediate_size": 96, "vocab_size": 18993}
    with pytest.raises(OpperfError, match="TP size 3 does not divide num_attention_heads 32"):
        rank_config(config, 3)


def test_scenario_spaces_and_scenario_names(tmp_path):
    space = tmp_path / "scenarios.yaml"
    space.write_text(SPACE)
    loaded = load_scenario_space(space, "t")
    assert [scenario_name(s) for s in loaded.scenarios("m")] == [
        "prefill:8", "prefill:32", "decode:2x16", "decode:4x16", "decode:8x16", "decode:2x32", "decode:4x32",
        "decode:8x32"]
    assert scenario_name(parse_scenario("decode:12x1024", "m", tp=4)) == "decode:12x1024@tp4"
    with pytest.raises(OpperfError, match=r"no scenario space 'x' \(spaces: t\)"):
        load_scenario_space(space, "x")
    with pytest.raises(OpperfError, match="not a scenario: 'decode:12'"):
        parse_scenario("decode:12", "m")
    space.write_text("spaces:\n  t:\n    prefill_tokens: [0]\n    decode_batches: [1]\n    decode_contexts: [1]\n")
    with pytest.raises(OpperfError, match=r"spaces\.t\.prefill_tokens.*integers >= 1"):
        load_scenario_space(space, "t")
    assert load_scenario_space(name="dense").decode_batches == (1, 2, 4, 8, 16, 32, 48, 64)


@pytest.fixture(scope="module")
def space_database(tmp_path_factory):
    """The tiny qwen3's query rows over a small scenario space, each given a latency that grows with the
    elements it reads and writes (1 µs + 1 ns each; replay is not what is tested), built as the workflow builds a
    database."""
    return _query_database(tmp_path_factory.mktemp("space"), TINY_QWEN3)


def _query_database(work, config_json, dtype="float32"):
    """A database of the rows of `config_json`'s queries over SPACE (space_database)."""
    from opperf.database.build import build_database_directory

    space = work / "scenarios.yaml"
    space.write_text(SPACE)
    recorded = record_consumer_queries(MODELS, [str(config_json)], "cpu", dtype, space, "t")
    rows = work / "rows" / "CPU" / "torch" / "torch2.13.0_cpu"
    rows.mkdir(parents=True)
    for kernel_type, generated in query_rows(recorded, "CPU").rows.items():
        for row in generated:
            shapes = [s for s in parse_shapes(row[INPUT_SHAPES]) + parse_shapes(row[OUTPUT_SHAPES]) if s]
            row["Average Duration(us)"] = f"{1 + sum(math.prod(s) for s in shapes) / 1000:.6f}"
            row["Replay Status"] = "ok"
        pd.DataFrame(generated).to_csv(rows / f"{kernel_type}.csv", index=False)
    database = work / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    build_database_directory(rows, "CPU", database, devices_path=REPO / "config" / "devices.yaml",
                             definitions_dir=REPO / "config" / "kernels")
    return database


def test_the_scenarios_between_a_spaces_points_are_its_midpoints():
    from opperf.consumer.scenarios import ScenarioSpace

    space = ScenarioSpace(prefill_tokens=(1, 2, 16, 64), decode_batches=(1, 4, 5), decode_contexts=(256, 512))
    # No room between 1 and 2 tokens, nor between batches 4 and 5: decode with the batch, the context or both
    # between points.
    assert space.between_points() == ["prefill:9", "prefill:40", "decode:2x256", "decode:2x512", "decode:1x384",
                                      "decode:4x384", "decode:5x384", "decode:2x384"]
    assert ScenarioSpace((8,), (2,), (64,)).between_points() == []
    dense = load_scenario_space(REPO / "config" / "scenarios.yaml", "dense")
    # 23 of its 30 prefill gaps and 6 of its 7 batch gaps have room for a midpoint; its 5 contexts leave 4.
    assert len(dense.between_points()) == 23 + 6 * 5 + 8 * 4 + 6 * 4


def test_a_listed_scenario_is_exact_and_one_between_grid_points_interpolates(space_database):
    from opperf.consumer.predict import predict

    source = model_source(str(TINY_QWEN3), MODELS)
    listed, between = predict(space_database, source, [parse_scenario("decode:4x16", source.name),
                                                        parse_scenario("decode:3x16", source.name)],
                              dtype=torch.float32, attention="cpu")
    assert listed.status_time_share["EXACT"] == pytest.approx(1.0)
    assert between.status_time_share["INTERPOLATED"] > 0.5
    # The decode GEMM of batch 3 lies between the rows of batch 2 and 4: linear, as the runtime interpolates.
    answers = {(r.query.op_name, tuple(tuple(t.shape) for t in r.query.inputs)): (status, latency)
               for r, status, latency, _ in between.answers}
    hidden = json.loads(TINY_QWEN3.read_text())["hidden_size"]
    status, latency = answers[("aten.mm.default", ((3, hidden), (hidden, hidden)))]
    at2, at4 = (1 + (2 * hidden + hidden * hidden + 2 * hidden) / 1000), (1 + (4 * hidden + hidden * hidden
                                                                            + 4 * hidden) / 1000)
    assert status == "INTERPOLATED" and latency == pytest.approx((at2 + at4) / 2, rel=1e-6)


def test_predict_reads_a_prediction_and_writes_its_json(space_database, tmp_path):
    """A scenario of the space: nothing falls to roofline; the JSON carries the scenario's answers."""
    out = tmp_path / "prediction.json"
    done = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(space_database),
                           "--transformers-config", str(TINY_QWEN3), "--dtype", "float32", "--scenario", "prefill:32",
                           "--scenario", "decode:8x32", "--json", str(out)], cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OPPERF_MSMODELING_DIR"})
    assert done.returncode == 0, done.stderr
    assert "answered by opperf's model of msmodeling's runtime" in done.stdout
    document = json.loads(out.read_text())
    assert [s["name"] for s in document["scenarios"]] == ["prefill:32", "decode:8x32"]
    for scenario in document["scenarios"]:
        assert scenario["status_time_share"]["MISS"] == 0 and scenario["status_queries"]["MISS"] == 0
        assert scenario["predicted_us"] == pytest.approx(sum(q["latency_us"] * q["calls"]
                                                             for q in scenario["queries"]), rel=1e-4)
    bad = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(tmp_path), "--model",
                          "opperf-tiny", "--scenario", "prefill:8"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "not a database directory (no op_mapping.yaml)" in bad.stderr


def _predict_cli(*argv: str):
    """scripts/predict.py as a user runs it: (exit code, stdout, stderr)."""
    done = subprocess.run([sys.executable, "scripts/predict.py", *argv], cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OPPERF_MSMODELING_DIR"})
    return done.returncode, done.stdout, done.stderr


def _gemm_rows(database) -> int:
    from opperf.consumer.runtime import layouts_path

    return sum(len(pd.read_csv(layouts_path(database / f"{kernel}.csv")))
               for kernel in ("mm", "addmm", "bmm") if (database / f"{kernel}.csv").is_file())


def test_the_database_records_its_dtype_and_predict_uses_it(space_database, tmp_path):
    """A float32 database (the tiny qwen3's queries in float32): op_mapping.yaml says so with its GEMM rows'
    count; predict.py without --dtype records its queries in float32 (every one EXACT: in bfloat16 none would be)
    and says where the dtype came from; a --dtype the database holds no rows of is refused in one line."""
    import yaml

    block = yaml.safe_load((space_database / "op_mapping.yaml").read_text())["opperf"]
    assert (block["dtype"], block["dtype_rows"], block["dtype_counted"]) == (
        "float32", {"float32": _gemm_rows(space_database)}, "GEMM rows")
    out = tmp_path / "prediction.json"
    code, stdout, stderr = _predict_cli("--database", str(space_database), "--transformers-config", str(TINY_QWEN3),
                                        "--scenario", "decode:4x16", "--json", str(out))
    assert code == 0, stderr
    assert stdout.splitlines()[0] == "database dtype: float32 (op_mapping.yaml)"
    # msmodeling's runner would ask for TensorCast's ops, which opperf's recorder did not record (or there is no
    # msmodeling checkout here): opperf's model answers, and says why.
    assert stdout.splitlines()[1] in (
        "answered by opperf's model of msmodeling's runtime (auto: the database's consumer queries were not recorded "
        "by msmodeling's runner (op_mapping.yaml opperf.consumer_queries), so it has no rows for what the runner "
        "asks; --runner msmodeling asks it anyway)",
        "answered by opperf's model of msmodeling's runtime (auto: no msmodeling checkout: set OPPERF_MSMODELING_DIR "
        "or --msmodeling, or lay it in ../shared/msmodeling)")
    document = json.loads(out.read_text())
    assert document["dtype"] == "float32" and document["scenarios"][0]["status_time_share"]["EXACT"] == 1.0
    code, stdout, stderr = _predict_cli("--database", str(space_database), "--model", "opperf-tiny", "--scenario",
                                        "prefill:8", "--dtype", "bfloat16")
    assert (code, stdout) == (2, "") and stderr.splitlines() == [
        f"error: field '--dtype': bfloat16: the database holds {_gemm_rows(space_database)} float32 GEMM rows "
        "(op_mapping.yaml): every bfloat16 GEMM query would miss its rows and fall to the roofline; predict in "
        "float32, or build a bfloat16 database"]


def test_an_older_database_without_a_dtype_is_read_from_its_rows(space_database, tmp_path):
    import shutil

    import yaml

    from opperf.consumer.predict import prediction_dtype

    older = tmp_path / "torch2.13.0_cpu"
    shutil.copytree(space_database, older)
    document = yaml.safe_load((older / "op_mapping.yaml").read_text())
    for key in ("dtype", "dtype_rows", "dtype_counted"):
        del document["opperf"][key]
    (older / "op_mapping.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    chosen = prediction_dtype(older)
    assert (chosen.name, chosen.said) == (
        "float32", "database dtype: float32 (read from its rows: op_mapping.yaml records none, an older build)")


def test_a_database_of_two_dtypes_needs_dtype(tmp_path):
    """GEMM rows in float32 and bfloat16 (a float32 profile beside bfloat16 query rows): no single dtype is
    recorded, predict.py refuses to choose, and --dtype chooses one the database holds."""
    from opperf.consumer.predict import prediction_dtype
    from opperf.database.build import build_database_directory

    rows = tmp_path / "rows"
    rows.mkdir()
    float32 = pd.read_csv(REPO / "tests/data/database/cpu_replayed/mm.csv", dtype=str, keep_default_na=False)
    bfloat16 = float32.replace({"Input Data Types": {"DT_FLOAT;DT_FLOAT": "DT_BF16;DT_BF16"},
                                "Output Data Types": {"DT_FLOAT": "DT_BF16"}})
    pd.concat([float32, bfloat16]).to_csv(rows / "mm.csv", index=False)
    database = tmp_path / "data" / "CPU" / "torch" / "torch2.13.0_cpu"
    build_database_directory(rows, "CPU", database, devices_path=REPO / "config" / "devices.yaml",
                             definitions_dir=REPO / "config" / "kernels")
    n = len(float32)
    code, stdout, stderr = _predict_cli("--database", str(database), "--model", "opperf-tiny", "--scenario",
                                        "prefill:8")
    assert (code, stdout) == (2, "") and stderr.splitlines() == [
        f"error: {database}/op_mapping.yaml, field 'opperf.dtype': the database holds several dtypes: {n} float32 "
        f"and {n} bfloat16 GEMM rows (op_mapping.yaml); say which to predict in with --dtype (bfloat16, float16, "
        "float32)"]
    chosen = prediction_dtype(database, "float32")
    assert chosen.name == "float32" and chosen.said.endswith("(op_mapping.yaml); predicting in float32 (--dtype)")


@pytest.mark.parametrize("scenario, message", [
    ("prefill:0", "'prefill:0': TOKENS must be >= 1, got 0"),
    ("decode:0x64", "'decode:0x64': BATCH must be >= 1, got 0"),
    ("decode:4x0", "'decode:4x0': CONTEXT must be >= 1, got 0")])
@pytest.mark.parametrize("model", [("--transformers-config", str(TINY_QWEN3)), ("--model", "opperf-tiny")],
                         ids=["config.json", "models.yaml"])
def test_a_scenario_of_nothing_is_refused_in_one_line(space_database, scenario, message, model):
    code, stdout, stderr = _predict_cli("--database", str(space_database), *model, "--scenario", "prefill:8",
                                        "--scenario", scenario)
    assert (code, stdout) == (2, "") and stderr.splitlines() == [
        f"error: field '--scenario': {message} (prefill:TOKENS or decode:BATCHxCONTEXT, e.g. prefill:1536, "
        "decode:16x1024)"]


def test_a_scenario_past_the_model_positions_is_answered_with_a_warning(space_database, tmp_path):
    """The tiny qwen3 is built for 512 positions: prefill:600 and decode:2x512 (position 513) are predicted, and
    each says in one line which limit it passes; prefill:512 says nothing. A models.yaml entry names its limit
    with the same field."""
    from opperf.consumer.model_queries import position_limit_warning

    code, stdout, stderr = _predict_cli("--database", str(space_database), "--transformers-config", str(TINY_QWEN3),
                                        "--scenario", "prefill:512", "--scenario", "prefill:600", "--scenario",
                                        "decode:2x512", "--top", "0")
    assert code == 0, stderr
    assert [line.split(" ", 1)[1] for line in stderr.splitlines() if "WARNING" in line] == [
        "WARNING opperf.predict: hf_qwen3: prefill:600 reaches position 600, past the model's "
        "max_position_embeddings 512: predicted as asked, but the model serves no such step",
        "WARNING opperf.predict: hf_qwen3: decode:2x512 reaches position 513, past the model's "
        "max_position_embeddings 512: predicted as asked, but the model serves no such step"]
    assert [line.split()[0] for line in stdout.splitlines()[4:]] == ["prefill:512", "prefill:600", "decode:2x512"]
    assert model_source("Llama-3-70B", MODELS).max_positions == 8192
    assert model_source("opperf-tiny", MODELS).max_positions is None
    assert position_limit_warning(parse_scenario("prefill:100000", "Llama-3-70B", tp=8), 8192) == (
        "prefill:100000@tp8 reaches position 100,000, past the model's max_position_embeddings 8,192: predicted as "
        "asked, but the model serves no such step")


def test_a_query_of_a_dtype_the_runtime_cannot_spell_is_reported_not_fatal(space_database, tmp_path):
    """A complex rotary's mul (complex64: no spelling in msmodeling's DTYPE_MAP): the check passes and lists the
    query with the dtype and slots the runtime cannot represent; the prediction prices it at the device's
    roofline as a MISS, with the same reason. A database row of that dtype is listed, not failed."""
    import shutil

    from opperf.consumer.interpolation import Database, Query, TensorSpec
    from opperf.consumer.predict import database_roofline, predict_step
    from opperf.consumer.queries import RecordedQuery, answer, modelled_exact_lookup
    from opperf.consumer.runtime import load_database
    from opperf.database.check import check_findable
    from opperf.database.report import check_database

    complex_mul = RecordedQuery(Query("aten.mul.Tensor", (TensorSpec((1, 8, 2, 8), torch.complex64),
                                                          TensorSpec((1, 8, 1, 8), torch.complex64)),
                                      (TensorSpec((1, 8, 2, 8), torch.complex64),)), 4, ["hf_x TP1 prefill 8 tokens"])
    float_mul = RecordedQuery(Query("aten.mul.Tensor", (TensorSpec((8, 64), torch.float32),
                                                        TensorSpec((8, 64), torch.float32)),
                                    (TensorSpec((8, 64), torch.float32),)), 2, ["hf_x TP1 prefill 8 tokens"])
    database = tmp_path / "torch2.13.0_cpu"
    shutil.copytree(space_database, database)
    mul = pd.read_csv(database / "mul.csv", dtype=str, keep_default_na=False)
    row = mul.iloc[[0]].replace({"Input Data Types": {mul.iloc[0]["Input Data Types"]: "COMPLEX64;COMPLEX64"},
                                 "Output Data Types": {mul.iloc[0]["Output Data Types"]: "COMPLEX64"}})
    pd.concat([mul, row]).to_csv(database / "mul.csv", index=False)
    reason = ("complex64 (inputs 0, 1, output 0): no spelling in the runtime's DTYPE_MAP, so it never finds a row "
              "and prices the call at its roofline")

    result = check_database(database, consumer_queries=[complex_mul, float_mul])
    assert result["passed"] and result["consumer"]["ok"]
    assert [(q["op"], q["status"], q["reason"]) for q in result["consumer"]["dtype_unmapped"]] == [
        ("aten.mul.Tensor", "DTYPE_UNMAPPED", reason)]
    assert result["kernel_types"]["mul"]["dtype_unmapped"] == [{"line": len(mul) + 2, "dtypes": ["COMPLEX64"]}]
    assert "aten.mul.Tensor [[[1, 8, 2, 8], 'complex64'], [[1, 8, 1, 8], 'complex64']] (4 calls; hf_x TP1 prefill 8 " \
           "tokens): complex64 (inputs 0, 1, output 0)" in result["table"]
    assert check_findable(*load_database(database))["mul"].misses == []

    answers = answer([complex_mul], database, modelled_exact_lookup)
    roofline = database_roofline(database)
    step = predict_step("prefill:8", None, [complex_mul], answers, Database.load(database), roofline)
    (_, status, latency_us, why), = step.answers
    assert (status, why) == ("MISS", reason)
    assert latency_us == pytest.approx(roofline.latency_us(complex_mul.query)) and latency_us > 0
    assert step.predicted_us == pytest.approx(4 * latency_us)


def test_a_scenario_space_shards_a_model_only_as_far_as_it_divides(tmp_path, caplog):
    """The default space's TP sizes 1/4/8 and a 4-head model: TP 8 is left out (and said once, naming the model
    and the size), TP 4 kept; OLMoE's query norm spans all heads, so its code does not run at TP 4 either. A
    models.yaml entry keeps its own tp_sizes."""
    default = load_scenario_space().tp_sizes
    assert default == (1, 4, 8)
    mistral = model_source(str(TINY_MISTRAL), MODELS)
    assert scenario_tp_sizes(mistral, default, dtype=torch.float32, attention="cpu") == (
        (1, 4), {8: "TP size 8 does not divide num_attention_heads 4"})
    kept, left_out = scenario_tp_sizes(model_source(str(TINY_OLMOE), MODELS), default, attention="cpu")
    assert kept == (1,) and list(left_out) == [4, 8]
    assert left_out[4].startswith("its code does not run on one rank's share of the config (RuntimeError: ")
    assert scenario_tp_sizes(model_source("opperf-tiny", MODELS), default) == ((1, 2), {})

    space = tmp_path / "scenarios.yaml"
    space.write_text("spaces:\n  t:\n    prefill_tokens: [8]\n    decode_batches: [2]\n    decode_contexts: [16]\n"
                     "    tp_sizes: [1, 4, 8]\n")
    with caplog.at_level("INFO", logger="opperf"):
        recorded = record_consumer_queries(MODELS, [str(TINY_MISTRAL)], "cpu", "float32", space, "t")
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name.startswith("opperf")] == [
        "scenario space 't': hf_tiny_mistral is recorded at TP 1, 4; left out: TP 8 (TP size 8 does not divide "
        "num_attention_heads 4)"]
    labels = {label for item in recorded for label in item.scenarios}
    assert {label.split()[1] for label in labels} == {"TP1", "TP4"}


def test_an_olmoe_config_goes_through_the_grid_with_the_experts_of_its_built_model(cpu_parsed, tmp_path):
    """OLMoE's convention (num_experts x intermediate_size, no moe_intermediate_size) as --target-models and
    --consumer-models on the cpu back end: its expert GEMMs are rows of the built model's expert weights (8 experts,
    [hidden, 2 x 48] and [48, hidden]); the TP sizes it does not split are said, not fatal."""
    experts = built_experts(TINY_OLMOE)
    space = tmp_path / "scenarios.yaml"
    space.write_text(SPACE.replace("decode_contexts: [16, 32]\n", "decode_contexts: [16]\n    tp_sizes: [1, 4, 8]\n"))
    out = tmp_path / "grid"
    done = subprocess.run([sys.executable, "scripts/generate_shape_grid.py", "--input-dir", str(cpu_parsed),
                           "--output-dir", str(out), "--backend", "cpu", "--max-hbm-gb", "16", "--models", str(MODELS),
                           "--target-models", str(TINY_OLMOE), "--consumer-models", str(TINY_OLMOE),
                           "--scenarios", str(space), "--scenario-space", "t"], cwd=REPO, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert "scenario space 't': hf_tiny_olmoe is recorded at TP 1; left out: TP 4 (its code does not run" in done.stderr
    grouped = pd.read_csv(out / "_grouped_mm.csv", dtype=str)
    weights = {tuple(int(d) for d in shapes.split(";")[1].split(",")) for shapes in grouped[INPUT_SHAPES]}
    assert weights == {tuple(experts.gate_up_proj.transpose(-2, -1).shape),
                       tuple(experts.down_proj.transpose(-2, -1).shape)} == {(8, 64, 96), (8, 48, 64)}
    tokens = {int(shapes.split(";")[0].split(",")[0]) for shapes in grouped[INPUT_SHAPES]}
    assert tokens == {16, 64, 4, 8}            # top-2 of each token: prefill 8 and 32, decode batches 2, 4 and 8


@pytest.fixture(scope="module")
def olmoe_database(tmp_path_factory):
    """The tiny OLMoE's query rows over SPACE in float32 (the cpu back end's dtype), as space_database."""
    return _query_database(tmp_path_factory.mktemp("olmoe"), TINY_OLMOE)


def test_predict_answers_an_olmoe_config_from_its_database(olmoe_database, tmp_path):
    """predict.py takes the OLMoE config as it takes any: every query of a listed scenario EXACT, its expert GEMMs
    those of the built model's expert weights, in float32 (torch's meta kernel of grouped_mm takes bfloat16 only)."""
    experts = built_experts(TINY_OLMOE)
    out = tmp_path / "prediction.json"
    done = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(olmoe_database),
                           "--transformers-config", str(TINY_OLMOE), "--dtype", "float32", "--scenario",
                           "decode:4x16", "--scenario", "prefill:32", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OPPERF_MSMODELING_DIR"})
    assert done.returncode == 0, done.stderr
    document = json.loads(out.read_text())
    assert document["model"] == "hf_tiny_olmoe"
    for scenario in document["scenarios"]:
        assert scenario["status_time_share"]["EXACT"] == pytest.approx(1.0)
        grouped = [q for q in scenario["queries"] if q["op"] == "aten._grouped_mm.default"]
        assert {tuple(q["inputs"][1][0]) for q in grouped} == {tuple(experts.gate_up_proj.transpose(-2, -1).shape),
                                                               tuple(experts.down_proj.transpose(-2, -1).shape)}
        assert {q["inputs"][1][1] for q in grouped} == {"float32"}


@pytest.mark.parametrize("tp, reason", [
    (8, "model 'hf_tiny_olmoe': TP size 8 does not divide num_attention_heads 4"),
    (2, "model 'hf_tiny_olmoe': its code does not run on one rank's share of the config"),
])
def test_predict_refuses_a_tp_size_the_model_does_not_split_by_in_one_line(olmoe_database, tmp_path, tp, reason):
    done = subprocess.run([sys.executable, "scripts/predict.py", "--database", str(olmoe_database),
                           "--transformers-config", str(TINY_OLMOE), "--dtype", "float32", "--tp", str(tp),
                           "--scenario", "decode:4x16"], cwd=REPO, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "OPPERF_MSMODELING_DIR"})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "error" in line]
    assert "field '--tp'" in line and reason in line
