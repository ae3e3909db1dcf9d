"""Generated rows, exactly: matmul from Qwen3-32B's GEMMs, elementwise, FIA, MoE; the HBM filter; constraints."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
import yaml

from opperf.contract import (ACCELERATOR_CORE, EP_SIZE, INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS, INPUT_SHAPES,
                             OP_STATE, OUTPUT_DTYPES, OUTPUT_FORMATS, OUTPUT_SHAPES, PROFILING_AVERAGE, SOURCE,
                             SOURCE_GENERATED, SOURCE_PROFILED, row_signature)
from opperf.grid import generate_kernel_rows, load_grid_config, load_models, prepare_settings
from opperf.grid.memory import BYTES_PER_GB, MemoryEstimator, tensor_bytes
from opperf.grid.templates import nd_to_fractal_nz
from opperf.parse.fia_metadata import RUNTIME_SEQ_LENGTHS_KV_VALUES, RUNTIME_SEQ_LENGTHS_VALUES

GRID = load_grid_config("config/grid.yaml")
MODELS = load_models("config/models.yaml")
STANDARD = GRID.standard


def profiled(inputs, outputs, dtypes_in, dtypes_out, formats_in=None, formats_out=None, core="AI_CORE", **extra):
    row = {OP_STATE: "dynamic", ACCELERATOR_CORE: core, INPUT_SHAPES: inputs, INPUT_DTYPES: dtypes_in,
           INPUT_FORMATS: formats_in or ";".join(["ND"] * len(dtypes_in.split(";"))), OUTPUT_SHAPES: outputs,
           OUTPUT_DTYPES: dtypes_out, OUTPUT_FORMATS: formats_out or ";".join(["ND"] * len(dtypes_out.split(";"))),
           PROFILING_AVERAGE: "12.5", SOURCE: SOURCE_PROFILED}
    row.update(extra)
    return row


def settings_for(models=(), *, rows=0, seed=0, max_hbm_gb=64.0, max_tokens=2, grid=GRID, model_table=None):
    return prepare_settings(grid_config=grid, models=model_table or MODELS, target_models=list(models), rows=rows,
                            seed=seed, max_hbm_gb=max_hbm_gb, max_tokens=max_tokens)


def shapes(rows):
    return [(r[INPUT_SHAPES], r[OUTPUT_SHAPES]) for r in rows]


MATMUL_TEMPLATE = profiled("136,7168;7168,3584", "136,3584", "DT_BF16;DT_BF16", "DT_BF16")
# Qwen3-32B (N, K) per TP, derived by hand in test_grid_models.py: qkv, o, gate_up, down, lm_head.
QWEN3_32B_NK_TP_1_4_8 = [
    (10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600), (151936, 5120),
    (2560, 5120), (5120, 2048), (12800, 5120), (5120, 6400), (37984, 5120),
    (1280, 5120), (5120, 1024), (6400, 5120), (5120, 3200), (18992, 5120),
]


NK_GRID = STANDARD.rule("NK_GRID").points()


def test_matmul_rows_are_tokens_times_qwen3_32b_pairs_then_nk_sweeps_with_inherited_metadata():
    table = dict(MODELS, **{"Qwen3-32B": dataclasses.replace(MODELS["Qwen3-32B"], tp_sizes=(1, 4, 8))})
    generated, result = generate_kernel_rows("MatMulV2", [MATMUL_TEMPLATE],
                                             settings_for(["qwen3-32b"], model_table=table))
    main = [(f"{m},{k};{k},{n}", f"{m},{n}") for m in (1, 2) for n, k in QWEN3_32B_NK_TP_1_4_8]
    # Then N over NK_GRID with K the hidden size, and K over NK_GRID with N the hidden size, at the sweeps'
    # token count (256, capped here at 2); a pair the models already gave is not repeated.
    sweeps = [(f"2,5120;5120,{n}", f"2,{n}") for n in NK_GRID] + [(f"2,{k};{k},5120", "2,5120") for k in NK_GRID]
    assert shapes(generated) == main + [s for s in dict.fromkeys(sweeps) if s not in main]
    for row in generated:
        assert (row[OP_STATE], row[ACCELERATOR_CORE], row[INPUT_DTYPES], row[INPUT_FORMATS], row[OUTPUT_DTYPES],
                row[OUTPUT_FORMATS]) == ("dynamic", "AI_CORE", "DT_BF16;DT_BF16", "ND;ND", "DT_BF16", "ND")
        assert row[SOURCE] == SOURCE_GENERATED and PROFILING_AVERAGE not in row
    assert (result.status, result.combinations) == ("generated", 30 + 2 * len(NK_GRID))
    assert result.generated + result.duplicates == result.combinations


def test_elementwise_rows_keep_the_templates_empty_slots_and_scalars():
    # aten::add as torch.profiler records it: self, other, alpha (a scalar: an empty shape slot).
    template = profiled("1,16,256;1,16,256;", "", "DT_FLOAT;DT_FLOAT;", "", core="CPU",
                        formats_in="ND;ND;", formats_out="", **{INPUT_SCALARS: ";;1"})
    template[OP_STATE] = "eager"
    generated, result = generate_kernel_rows("add", [template], settings_for(["opperf-tiny"]))
    # elementwise_3d_binary: b in small_batch [1, 2, 4], s in tokens [1, 2], b * s <= max_tokens (2),
    # h in opperf-tiny's widths: hidden 256, MLP width 688 (TP 1) and 344 (TP 2).
    expected = [(f"{b},{s},{h};{b},{s},{h};", "") for b, s in ((1, 1), (1, 2), (2, 1)) for h in (256, 688, 344)]
    # Then the width sweep: h over ELEM_HIDDEN_GRID (NK_GRID's points) at b = 1 and the sweeps' token count.
    sweep = [(f"1,2,{h};1,2,{h};", "") for h in NK_GRID]
    assert shapes(generated) == expected + [s for s in sweep if s not in expected]
    assert {(r[INPUT_SCALARS], r[INPUT_DTYPES], r[INPUT_FORMATS], r[OP_STATE]) for r in generated} == {
        (";;1", "DT_FLOAT;DT_FLOAT;", "ND;ND;", "eager")}
    # b * s > 2 for (2, 2), (4, 1), (4, 2): 3 x 3 widths here, and 3 in rowwise_3d (routed too; fits no row).
    assert result.rejected_by_constraints == 9 + 3


def test_constraints_filter_combinations(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "patterns": {"tall": {"iterators": {"t": [1, 3, 5], "h": [8, 16]},
                              "constants": {"limit": 40},
                              "constraints": ["t * h <= limit", "t % 2 == 1 and h >= 8"],
                              "inputs": ["t, h"], "outputs": ["t, h"]}},
        "router": {"Neg": "tall"}}, sort_keys=False))
    template = profiled("4,4", "4,4", "DT_FLOAT16", "DT_FLOAT16", core="AI_VECTOR_CORE")
    generated, result = generate_kernel_rows("Neg", [template], settings_for(grid=load_grid_config(grid)))
    assert shapes(generated) == [("1,8", "1,8"), ("1,16", "1,16"), ("3,8", "3,8"), ("5,8", "5,8")]
    assert (result.combinations, result.rejected_by_constraints) == (6, 2)     # (3,16)=48, (5,16)=80 > 40


def test_pattern_columns_write_expression_values_into_extra_columns(tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({
        "patterns": {"dfc_like": {"iterators": {"ep": [8, 16], "t": [4]}, "columns": {EP_SIZE: "ep"},
                                  "inputs": ["t, 256 // ep"], "outputs": ["t, 256 // ep"]}},
        "router": {"DispatchFFNCombine": "dfc_like"}}, sort_keys=False))
    template = profiled("4,4", "4,4", "DT_BF16", "DT_BF16", **{EP_SIZE: "4"})
    generated, _ = generate_kernel_rows("DispatchFFNCombine", [template], settings_for(grid=load_grid_config(grid)))
    assert [(r[EP_SIZE], r[INPUT_SHAPES]) for r in generated] == [("8", "4,32"), ("16", "4,16")]


FIA_TEMPLATE = profiled(
    "1024,8,128;1024,1,128;1024,1,128;;2048,2048;1;1" + ";" * 24, "1024,8,128;1",
    ";".join(["DT_BF16"] * 3 + ["DT_BF16", "BOOL", "INT64", "INT64"] + ["DT_BF16"] * 24), "DT_BF16;FLOAT",
    core="MIX_AIC")


def test_fia_rows_have_the_full_slot_layout_and_actual_sequence_lengths():
    model = dataclasses.replace(MODELS["Qwen3-32B"], tp_sizes=(8,))          # 8 query heads, 1 KV head per rank
    grid = dataclasses.replace(GRID, patterns=dict(GRID.patterns, fused_infer_attention=dataclasses.replace(
        GRID.patterns["fused_infer_attention"], params={
            "prefill_batches": [2], "prefill_seq_lens": [128], "decode_batches": [4],
            "decode_context_lens": [300]})))
    generated, _ = generate_kernel_rows("FusedInferAttentionScore", [FIA_TEMPLATE], settings_for(
        ["Qwen3-32B"], grid=grid, max_tokens=4096, model_table=dict(MODELS, **{"Qwen3-32B": model})))
    # Slots: 0 query, 1 key, 2 value, 4 atten_mask, 5/6 actual_seq_lengths(_kv), 14 block_table; 31 in all.
    scene = [r["Runtime source_profile"] for r in generated]
    prefill, decode = generated[0], generated[scene.index("shape_grid:dense_decode")]
    assert prefill[INPUT_SHAPES] == "256,8,128;256,1,128;256,1,128;;2048,2048;2;2" + ";" * 24
    assert prefill[OUTPUT_SHAPES] == "256,8,128;"
    assert (prefill[RUNTIME_SEQ_LENGTHS_VALUES], prefill[RUNTIME_SEQ_LENGTHS_KV_VALUES]) == ("128,256", "128,128")
    # Decode: 4 sequences of 300 tokens in 128-token blocks: 3 blocks each, 12 in the cache.
    assert decode[INPUT_SHAPES] == "4,8,128;12,1,128,128;12,1,128,128;;;4;4;;;;;;;;4,3" + ";" * 16
    assert decode[OUTPUT_SHAPES] == "4,8,128;"
    assert (decode[RUNTIME_SEQ_LENGTHS_VALUES], decode[RUNTIME_SEQ_LENGTHS_KV_VALUES]) == ("1,2,3,4",
                                                                                           "300,300,300,300")
    assert decode[INPUT_DTYPES] == FIA_TEMPLATE[INPUT_DTYPES] and decode[OUTPUT_DTYPES] == "DT_BF16;FLOAT"
    # Each scene then sweeps, at batch 1 and length 256, query heads (KV 1: all of HEADS_GRID), KV heads (8 query
    # heads: those dividing 8) and head_dim, one at a time around the layout (8, 1, 128).
    layouts = {scene_name: sorted({(int(r["Runtime num_heads"]), int(r["Runtime num_key_value_heads"]),
                                    int(r[INPUT_SHAPES].split(",")[2].split(";")[0])) for r in generated
                                   if r["Runtime source_profile"] == scene_name and r[RUNTIME_SEQ_LENGTHS_KV_VALUES]
                                   in ("256", "256,")}) for scene_name in set(scene)}
    heads = STANDARD.rule("HEADS_GRID").points()
    expected = sorted({(h, 1, 128) for h in heads} | {(8, kv, 128) for kv in (1, 2, 4, 8)}
                      | {(8, 1, d) for d in (64, 128, 256)})
    assert layouts == {"shape_grid:dense_prefill": expected, "shape_grid:dense_decode": expected}


def test_moe_token_permute_rows_from_qwen3_moe_expert_layout():
    template = profiled("64,4096;64,8", "512,4096;512", "DT_BF16;INT32", "DT_BF16;INT32", core="AI_VECTOR_CORE")
    generated, _ = generate_kernel_rows("MoeTokenPermute", [template], settings_for(["Qwen3-235B-A22B"]))
    # hidden 4096, top-8 routing: T tokens → T*8 permuted rows. Every EP size gives the same shapes: kept once.
    assert shapes(generated) == [("1,4096;1,8", "8,4096;8"), ("2,4096;2,8", "16,4096;16")]


def test_dispatch_ffn_combine_rows_carry_ep_size_in_the_signature():
    template = profiled("64,7168;16,7168,4096;16,2048,7168;64,8;65536;114688;64,8", "64,7168;16",
                        "DT_INT8;DT_INT8;DT_INT8;INT32;FLOAT;FLOAT;FLOAT", "DT_BF16;INT32", core="MIX_AIC",
                        **{EP_SIZE: "16"})
    generated, result = generate_kernel_rows("DispatchFFNCombine", [template], settings_for(["dsv3"]))
    # DeepSeek-V3: 256 experts; EP 16/32/64 → 16/8/4 experts per rank (EP 8 → 32 > 16: skipped); N = 2 * 2048.
    assert [(r[EP_SIZE], r[INPUT_SHAPES]) for r in generated if r[INPUT_SHAPES].startswith("1,")] == [
        ("16", "1,7168;16,7168,4096;16,2048,7168;1,8;65536;114688;1,8"),
        ("32", "1,7168;8,7168,4096;8,2048,7168;1,8;32768;57344;1,8"),
        ("64", "1,7168;4,7168,4096;4,2048,7168;1,8;16384;28672;1,8")]
    assert len(generated) == 6 and result.duplicates == 0
    assert len({row_signature(r, "DispatchFFNCombine") for r in generated}) == 6


def test_generated_rows_never_repeat_an_existing_signature():
    existing = profiled("2,256;256,512", "2,512", "DT_BF16;DT_BF16", "DT_BF16")        # = m 2, opperf-tiny qkv
    generated, result = generate_kernel_rows("MatMulV3", [MATMUL_TEMPLATE, existing], settings_for(["opperf-tiny"]))
    signatures = [row_signature(r, "MatMulV3") for r in generated]
    assert len(set(signatures)) == len(signatures)
    # One more duplicate than without the profiled row (sweeps that repeat a model pair are duplicates too).
    _, alone = generate_kernel_rows("MatMulV3", [MATMUL_TEMPLATE], settings_for(["opperf-tiny"]))
    assert row_signature(existing, "MatMulV3") not in signatures and result.duplicates == alone.duplicates + 1


def test_rows_over_the_hbm_budget_are_dropped_and_counted():
    # 1 GiB, no workspace: Qwen3-32B's TP-1 lm_head weight alone (5120 x 151936 x 2 B = 1.45 GiB) cannot fit.
    without_sweeps = dict(GRID.patterns, gemm=dataclasses.replace(GRID.patterns["gemm"], sweeps=()))
    grid = dataclasses.replace(GRID, patterns=without_sweeps, memory=dataclasses.replace(
        GRID.memory, workspace_fraction=0.0, workspace_mib=0.0))
    table = dict(MODELS, **{"Qwen3-32B": dataclasses.replace(MODELS["Qwen3-32B"], tp_sizes=(1, 4, 8))})
    settings = settings_for(["Qwen3-32B"], grid=grid, max_hbm_gb=1.0, max_tokens=16384, model_table=table)
    generated, result = generate_kernel_rows("MatMulV2", [MATMUL_TEMPLATE], settings)
    bytes_needed = {(m, n, k): (m * k + k * n + m * n) * 2 for m in settings.grids.values("M_GRID", field="m")
                    for n, k in QWEN3_32B_NK_TP_1_4_8}
    fitting = [(f"{m},{k};{k},{n}", f"{m},{n}") for (m, n, k), size in bytes_needed.items() if size <= BYTES_PER_GB]
    assert shapes(generated) == fitting
    assert result.over_hbm_budget == len(bytes_needed) - len(fitting) > 0
    assert not any(";5120,151936" in r[INPUT_SHAPES] for r in generated)


def test_memory_estimator_reads_fractal_nz_and_profiler_dtype_names():
    assert tensor_bytes((2, 64, 16, 16), "DT_BF16", "FRACTAL_NZ") == 1024 * 32 * 2   # ND (1024, 32)
    assert tensor_bytes((4, 4), "FLOAT", "ND") == 64 and tensor_bytes((4, 4), "DT_INT8", "ND") == 16
    assert tensor_bytes((4, 4), "MYSTERY", "ND") == 128                               # unknown: 8 bytes
    assert tensor_bytes(None, "DT_BF16", "ND") == 0
    estimator = MemoryEstimator.for_budget_gb(1.0, workspace_fraction=0.5, workspace_mib=1)
    assert estimator.row_bytes([(1024, 1024)], ["DT_BF16"], ["ND"], [], [], []) == math.ceil(2 * 2**20 * 1.5) + 2**20


def test_fractal_nz_weight_slots_get_nz_storage_shapes():
    template = profiled("16,4096;256,256,16,16", "16,4096", "DT_BF16;DT_BF16", "DT_BF16", formats_in="ND;FRACTAL_NZ")
    generated, _ = generate_kernel_rows("MatMulV2", [template], settings_for(["opperf-tiny"], max_tokens=1))
    # opperf-tiny qkv at TP 1: (N, K) = (512, 256) → ND weight (256, 512) → NZ (512/16, 256/16, 16, 16).
    assert generated[0][INPUT_SHAPES] == "1,256;32,16,16,16"
    assert nd_to_fractal_nz((256, 512), "DT_BF16") == (32, 16, 16, 16)
    assert nd_to_fractal_nz((100, 100), "DT_INT8") == (4, 7, 16, 32)
    # A (K, N) = (128, 8) weight would be stored padded to (128, 16): it cannot stand in an NZ slot.
    from opperf.grid.candidate import Candidate
    from opperf.grid.templates import templates_from_rows

    (nz_template,), _ = templates_from_rows([template])
    assert nz_template.fit(Candidate(((4, 128), (128, 8)), ((4, 8),)), "tensors") is None
    assert nz_template.fit(Candidate(((4, 128), (128, 32)), ((4, 32),)), "tensors")[0][1] == (2, 8, 16, 16)


def test_kernel_types_without_a_pattern_or_a_fitting_row_generate_nothing():
    grad = profiled("4,2,8;4,2,8", "4,2,8", "DT_BF16;DT_BF16", "DT_BF16")
    assert generate_kernel_rows("FlashAttentionScoreGrad", [grad], settings_for())[1].status == "no_pattern"
    scalar_add = profiled(";", "", "FLOAT;FLOAT", "FLOAT")          # a scalar add: no tensor slot to vary
    generated, result = generate_kernel_rows("Add", [scalar_add], settings_for())
    assert generated == [] and result.status == "no_fitting_profiled_row"


# Scalar arguments a template needs for the patterns that require them (checked against the pattern below).
TEMPLATE_SCALARS = {"rope_cat_4d": ";;-1", "kv_cache_cat_4d": ";;2", "sdpa_prefill": ";;;0.;True;;",
                    "sdpa_decode": ";;;0.;False;;"}
ALL_MODELS = ["Qwen3-32B", "Qwen3-235B-A22B", "DeepSeek-V3", "Llama-3-70B", "Qwen2.5-7B"]


@pytest.mark.parametrize("name", sorted(GRID.patterns))
def test_every_shipped_pattern_generates_valid_rows_for_the_real_models(name):
    from opperf.contract import format_shapes, parse_shapes
    from opperf.grid.patterns import CandidateStats, pattern_candidates

    pattern = GRID.patterns[name]
    settings = settings_for(ALL_MODELS, max_tokens=256)
    candidates = list(pattern_candidates(pattern, settings.grids, CandidateStats()))
    assert len(candidates) > 1
    first = candidates[0]
    scalars = TEMPLATE_SCALARS.get(name, "")
    if pattern.require_template:
        assert pattern.accepts({INPUT_SCALARS: scalars})

    def names(slots, dtype):
        return ";".join(dtype if s else "" for s in slots)
    template = profiled(format_shapes(first.inputs), format_shapes(first.outputs), names(first.inputs, "DT_BF16"),
                        names(first.outputs, "DT_BF16"), formats_in=names(first.inputs, "ND"),
                        formats_out=names(first.outputs, "ND"), **{INPUT_SCALARS: scalars})
    kernel_type = next(t for t, routed in GRID.router.items() if name in routed)
    generated, result = generate_kernel_rows(kernel_type, [template], settings)
    assert generated and result.no_fitting_template < result.combinations
    signatures = {row_signature(r, kernel_type) for r in generated} | {row_signature(template, kernel_type)}
    assert len(signatures) == len(generated) + 1
    for row in generated:
        assert len(parse_shapes(row[INPUT_SHAPES])) == len(first.inputs)
        assert len(parse_shapes(row[OUTPUT_SHAPES])) == len(first.outputs)


@given(batch=st.lists(st.integers(1, 4), max_size=2), rows=st.integers(1, 64), cols=st.integers(1, 64),
       dtype=st.sampled_from(["DT_BF16", "DT_FLOAT16", "DT_INT8", "DT_FLOAT"]))
def test_nz_storage_shape_reads_back_as_the_padded_nd_shape(batch, rows, cols, dtype):
    from opperf.contract import dtype_bytes, fractal_nz_to_nd

    c0 = int(32 // dtype_bytes(dtype))
    storage = nd_to_fractal_nz((*batch, rows, cols), dtype)
    assert storage[-2:] == (16, c0)
    assert fractal_nz_to_nd(storage) == (*batch, -(-rows // 16) * 16, -(-cols // c0) * c0)


@given(layout=st.lists(st.one_of(st.none(), st.integers(1, 4)), min_size=1, max_size=8))
def test_tensor_matching_keeps_the_templates_empty_slots(layout):
    from opperf.grid.candidate import Candidate
    from opperf.grid.templates import Slot, Template

    template = Template((), tuple(Slot(rank or 0, "ND", "DT_BF16") for rank in layout), ())
    tensors = tuple(tuple(range(2, 2 + rank)) for rank in layout if rank)
    fitted = template.fit(Candidate(tensors, ()), "tensors")
    if not tensors:
        assert fitted == (tuple(None for _ in layout), ())
        return
    inputs, _ = fitted
    assert [s is None for s in inputs] == [rank is None for rank in layout]
    assert [s for s in inputs if s] == list(tensors)
    # One tensor too many, or one of a different rank, does not fit.
    assert template.fit(Candidate(tensors + ((5,),), ()), "tensors") is None
    assert template.fit(Candidate(((1,) * 9,) + tensors[1:], ()), "tensors") is None
