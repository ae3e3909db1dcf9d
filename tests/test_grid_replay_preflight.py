"""Generated NPU rows are replayable: each builds with its kernel definition (inputs on the CPU, API not called).

Templates are the replay stage's example rows (one per NPU kernel definition, in the layouts the hooks
expect); the grid generates rows for the real models from them, and every generated row must build the
way `scripts/replay.py` would build it on an Ascend host.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml

from opperf.grid import generate_kernel_rows, load_grid_config, load_models, prepare_settings
from opperf.grid.runner import generate_kernel_grid
from opperf.parse.fia_metadata import RUNTIME_SEQ_LENGTHS_KV_VALUES
from opperf.replay.definitions import definition_for, load_definitions
from opperf.replay.inputs import BuildContext, build_argument

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_ROWS = REPO / "tests" / "data" / "replay_npu" / "example_rows.csv"
DEFINITIONS = load_definitions(REPO / "config" / "kernels" / "npu", backend="npu")
# Small dense, MoE and MLA+MoE models: the layouts are what is checked, and building real-size tensors on
# the CPU would take minutes.
SMALL_MODELS = {
    "small-dense": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4,
                    "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 512, "tp_sizes": [1, 2]},
    "small-moe": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 32, "vocab_size": 512, "num_experts": 8, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "tp_sizes": [1, 2], "ep_sizes": [2, 4]},
    "small-mla": {"hidden_size": 128, "intermediate_size": 256, "num_attention_heads": 4, "vocab_size": 512,
                  "q_lora_rank": 64, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                  "v_head_dim": 16, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "first_k_dense_replace": 1, "tp_sizes": [1, 2], "ep_sizes": [2]},
}
_SHIPPED = load_grid_config(REPO / "config" / "grid.yaml")
# FIA's shipped sequence lengths are for real deployments; shorter ones keep the CPU-built caches small.
GRID = dataclasses.replace(_SHIPPED, patterns=dict(_SHIPPED.patterns, fused_infer_attention=dataclasses.replace(
    _SHIPPED.patterns["fused_infer_attention"], params={
        "prefill_batches": [1, 2], "prefill_seq_lens": [16, 24], "decode_batches": [1, 2, 3],
        "decode_context_lens": [100, 300], "sweep_seq_len": 24})))
with open(EXAMPLE_ROWS, newline="", encoding="utf-8") as handle:
    TEMPLATES = [row for row in csv.DictReader(handle) if GRID.patterns_for(row["Type"])]
# Kernel types of the replay examples that the grid has no pattern for (listed in the grid's log).
WITHOUT_PATTERN = {"RINGMLAPrefillBF16Kernel", "FlashAttentionScoreGrad",
                   # Kernel types added for the vLLM-Ascend coverage (issue 10): replayable from profiled rows,
                   # no grid pattern yet.
                   "AddRmsNormDynamicQuant", "ApplyRotaryPosEmb", "ApplyTopKTopPCustom", "ApplyTopKTopPWithSorted",
                   "AttentionUpdate", "BroadcastTo", "ClipByValueV2", "ConcatD", "Cumsum", "Equal", "Fill", "FloorDiv",
                   "FloorMod", "GatherElementsV2", "Greater", "GreaterEqual", "HistogramV2", "IndexFill", "IndexPutV2",
                   "LayerNormV3", "Less", "LightningIndexer", "Log", "LogicalAnd", "LogicalNot", "NotEqual", "Pack",
                   "Range", "ReduceSum", "RepeatInterleave", "ScatterElementsV2", "SelectV2", "SparseFlashAttention",
                   "Tile", "TransData", "ZerosLike", "_triton_rope", "batch_matmul_transpose_0", "muls_add_kernel",
                   "PagedCacheLoadNdKernel", "AtbRopeKernel"}


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
    models = tmp_path_factory.mktemp("models") / "models.yaml"
    models.write_text(yaml.safe_dump(SMALL_MODELS))
    return prepare_settings(grid_config=GRID, models=load_models(models), target_models=list(SMALL_MODELS),
                            rows=0, seed=0, max_hbm_gb=64, max_tokens=64)


def build(kernel_type: str, row: dict, line: int) -> None:
    definition = definition_for(DEFINITIONS, kernel_type, "npu")
    ctx = BuildContext(definition, dict(row, Type=kernel_type), "cpu", path="generated", line=line)
    if definition.hook:
        importlib.import_module(definition.hook).build_call(ctx.row, ctx)
    else:
        for index, spec in enumerate(definition.inputs):
            build_argument(spec, index, ctx)


def single_sequence_fia(kernel_type: str, row: dict) -> bool:
    return kernel_type == "FusedInferAttentionScore" and "," not in row.get(RUNTIME_SEQ_LENGTHS_KV_VALUES, ",")


def test_every_replay_example_type_but_the_listed_ones_has_a_pattern():
    with open(EXAMPLE_ROWS, newline="", encoding="utf-8") as handle:
        types = {row["Type"] for row in csv.DictReader(handle)}
    assert {t for t in types if not GRID.patterns_for(t)} == WITHOUT_PATTERN


@pytest.mark.parametrize("template", TEMPLATES, ids=[f"{r['Type']}-{i}" for i, r in enumerate(TEMPLATES)])
def test_generated_rows_build_with_the_npu_kernel_definition(template, settings):
    """The first and the last row of every bucket (the ends of each swept axis)."""
    kernel_type = template["Type"]
    grid = generate_kernel_grid(kernel_type, [template], settings)
    assert grid.rows and grid.buckets, grid.result
    for line in sorted({index for bucket in grid.buckets for index in (bucket.rows[0], bucket.rows[-1])}):
        row = grid.rows[line]
        if not single_sequence_fia(kernel_type, row):
            build(kernel_type, row, line + 2)


def test_single_sequence_fia_rows_build(settings):
    template = next(r for r in TEMPLATES if r["Type"] == "FusedInferAttentionScore")
    generated, _ = generate_kernel_rows("FusedInferAttentionScore", [template],
                                        dataclasses.replace(settings, rows=0))
    row = next(r for r in generated if single_sequence_fia("FusedInferAttentionScore", r))
    build("FusedInferAttentionScore", row, 2)
