"""The consumer's view: the queries a dispatch-mode performance model records for the reference decoder."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from opperf.consumer.queries import (
    answer,
    answer_summary,
    modelled_exact_lookup,
    rank_dims,
    reference_queries,
    scenarios,
    write_query_manifest,
)
from opperf.consumer.scenarios import Scenario
from opperf.errors import OpperfError
from opperf.workload.model import load_model_dims

DATA = Path(__file__).parent / "data" / "runtime_db"
F32 = torch.float32


def calls(recorded, op_name):
    return {tuple(tuple(t.shape) for t in r.query.inputs): r.calls for r in recorded if r.query.op_name == op_name}


def test_linear_and_sdpa_arrive_as_the_kernels_the_demo_profile_holds(repo):
    recorded = reference_queries(repo / "config" / "models.yaml", [Scenario("opperf-tiny", 1, "prefill", 1, 16)],
                                 dtype=F32, attention="cpu")
    ops = {r.query.op_name for r in recorded}
    assert "aten.linear.default" not in ops and "aten.scaled_dot_product_attention.default" not in ops
    # 2 layers: QKV (8+2*4 heads of 32), O, gate_up (2*688), down; lm_head on the last token goes through bmm.
    assert calls(recorded, "aten.mm.default") == {((16, 256), (256, 512)): 2, ((16, 256), (256, 256)): 2,
                                                  ((16, 256), (256, 1376)): 2, ((16, 688), (688, 256)): 2}
    assert calls(recorded, "aten.bmm.default") == {((1, 1, 256), (1, 256, 4096)): 1}
    assert calls(recorded, "aten._scaled_dot_product_flash_attention_for_cpu.default") == {
        ((1, 8, 16, 32), (1, 8, 16, 32), (1, 8, 16, 32)): 2}
    assert calls(recorded, "aten.embedding.default") == {((4096, 256), (1, 16)): 1}
    views = {r.query.op_name for r in recorded if r.view}
    assert {"aten.t.default", "aten.view.default", "aten._unsafe_view.default"} <= views
    assert "aten.mm.default" not in views


def test_full_dims_are_per_rank_and_counted_over_every_layer(repo):
    models = repo / "config" / "models.yaml"
    qwen = rank_dims(load_model_dims(models, "Qwen3-32B"), 8)
    assert (qwen.num_attention_heads, qwen.num_key_value_heads, qwen.intermediate_size, qwen.vocab_size) == (
        8, 1, 3200, 18992)
    recorded = reference_queries(models, [Scenario("Qwen3-32B", 8, "decode", 2, 1, 64)])
    assert calls(recorded, "aten.mm.default") == {((2, 5120), (5120, 1280)): 64, ((2, 1024), (1024, 5120)): 64,
                                                  ((2, 5120), (5120, 6400)): 64, ((2, 3200), (3200, 5120)): 64,
                                                  ((2, 5120), (5120, 18992)): 1}
    assert calls(recorded, "aten._scaled_dot_product_flash_attention_for_cpu.default") == {
        ((2, 8, 1, 128), (2, 8, 65, 128), (2, 8, 65, 128)): 64}
    assert {s.dtype for r in recorded for s in r.query.inputs if s.dtype.is_floating_point} == {torch.bfloat16}
    with pytest.raises(OpperfError, match="does not divide"):
        rank_dims(load_model_dims(models, "Qwen3-32B"), 3)


def test_moe_experts_get_the_balanced_token_split_on_meta(repo):
    recorded = reference_queries(repo / "config" / "models.yaml", [Scenario("DeepSeek-V3", 8, "decode", 2, 1, 64)])
    experts = calls(recorded, "aten.mm.default")
    # 2 tokens x top-8 = 16 routed rows over 256 experts: 16 experts run one row each, in all 61 layers.
    assert experts[((1, 7168), (7168, 512))] == 16 * 61 and experts[((1, 256), (256, 7168))] == 16 * 61
    assert experts[((2, 7168), (7168, 256))] == 61          # the router (replicated, not sharded)
    assert experts[((2, 7168), (7168, 16160))] == 1         # lm_head: vocab 129280 / 8


def test_answer_on_rows_of_the_demo_database(repo):
    recorded = reference_queries(repo / "config" / "models.yaml",
                                 [Scenario("opperf-tiny", 1, "prefill", 1, t) for t in (16, 40)], dtype=F32)
    answered = answer(recorded, DATA / "cpu", modelled_exact_lookup)
    answers = {(a.recorded.query.op_name, tuple(tuple(s.shape) for s in a.recorded.query.inputs)): a
               for a in answered}
    exact = answers[("aten.mm.default", ((16, 256), (256, 512)))]
    assert (exact.status, exact.latency_us, exact.reason) == ("EXACT", 151.2468, "mm.csv line 2")
    between = answers[("aten.mm.default", ((40, 256), (256, 512)))]
    assert between.status == "INTERPOLATED"
    assert between.latency_us == pytest.approx(201.2853 + (40 - 32) / (64 - 32) * (1136.5725 - 201.2853), rel=1e-12)
    view = answers[("aten.t.default", ((256, 256),))]
    assert view.status == "MISS" and "zero_cost" in view.reason
    summary = answer_summary(answered)
    assert summary["by_status"]["EXACT"]["queries"] >= 6
    assert sum(s["queries"] for s in summary["by_status"].values()) == len(answered) == len(recorded)
    assert summary["by_op"]["aten.mm.default"] == {"EXACT": 4, "INTERPOLATED": 4}


def test_scenarios_and_manifest(tmp_path, repo):
    default = scenarios()
    assert Counter(s.phase for s in default) == {"prefill": 2 * 3 * 18, "decode": 2 * 3 * 9 * 2}
    assert {s.tokens for s in default if s.phase == "prefill"} >= {1, 8192}
    recorded = reference_queries(repo / "config" / "models.yaml", [Scenario("opperf-tiny", 1, "decode", 3, 1, 8)],
                                 dtype=F32)
    path = tmp_path / "queries.jsonl"
    write_query_manifest(path, recorded)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == len(recorded) and lines[0]["query"]["inputs"][0]["dtype"] == "float32"
    assert all(line["workload_id"] == "opperf-tiny TP1 decode batch 3, context 8" for line in lines)
