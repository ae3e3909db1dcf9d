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

from conftest import REPO
from opperf.contract import INPUT_SHAPES, OUTPUT_SHAPES, parse_shapes
from opperf.database.model_queries import model_queries, model_source, parse_scenario, rank_config, scenario_name
from opperf.errors import OpperfError
from opperf.grid.queries import query_rows, record_consumer_queries
from opperf.scenarios import load_scenario_space

pytest.importorskip("transformers")

TINY_QWEN3 = REPO / "benchmarks" / "workloads" / "tiny" / "qwen3.json"
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
    from opperf.database.build import build_database_directory

    work = tmp_path_factory.mktemp("space")
    space = work / "scenarios.yaml"
    space.write_text(SPACE)
    recorded = record_consumer_queries(MODELS, [str(TINY_QWEN3)], "cpu", "float32", space, "t")
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


def test_a_listed_scenario_is_exact_and_one_between_grid_points_interpolates(space_database):
    from opperf.database.predict import predict

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
