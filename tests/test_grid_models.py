"""Model configs → GEMM (N, K) pairs, attention/MoE layouts and token counts, checked against hand-derived values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from conftest import built_experts
from opperf.density import load_standard
from opperf.errors import OpperfError
from opperf.grid.models import load_models, select_models
from opperf.grid.values import ValueGrids, token_counts

MODELS = load_models("config/models.yaml")
CONFIGS = Path(__file__).parent / "data" / "workload"
STANDARD = load_standard()


def value_grids(models, generic=None, max_tokens=8, **options):
    return ValueGrids(grids={}, generic=generic or {}, models=models, max_tokens=max_tokens, standard=STANDARD,
                      **options)

# Qwen3-32B: hidden 5120, 64 query heads, 8 KV heads, head_dim 128, intermediate 25600, vocab 151936.
#   qkv   N = (64/tp + 2 * 8/tp) * 128      K = 5120        (column parallel)
#   o     N = 5120                          K = 64/tp * 128 (row parallel)
#   gate_up N = 2 * 25600/tp                K = 5120
#   down  N = 5120                          K = 25600/tp
#   lm_head N = 151936/tp                   K = 5120
QWEN3_32B_NK = {
    1: [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600), (151936, 5120)],
    4: [(2560, 5120), (5120, 2048), (12800, 5120), (5120, 6400), (37984, 5120)],
    8: [(1280, 5120), (5120, 1024), (6400, 5120), (5120, 3200), (18992, 5120)],
}


@pytest.mark.parametrize("tp", [1, 4, 8])
def test_qwen3_32b_gemm_pairs_per_tp(tp):
    projections = MODELS["Qwen3-32B"].gemm_projections(tp)
    assert [name for name, _, _ in projections] == ["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]
    assert [(n, k) for _, n, k in projections] == QWEN3_32B_NK[tp]


def test_model_gemm_grid_enumerates_tp_sizes_in_order_without_repeats():
    model = dataclasses.replace(MODELS["Qwen3-32B"], tp_sizes=(1, 4, 8))
    assert value_grids([model]).values("model.gemm_nk", field="f") == (
        QWEN3_32B_NK[1] + QWEN3_32B_NK[4] + QWEN3_32B_NK[8])
    # The same pair from two models appears once, and remembers both.
    other = dataclasses.replace(model, name="other", tp_sizes=(4,))
    both = value_grids([model, other])
    assert both.values("model.gemm_nk", field="f") == value_grids([model]).values("model.gemm_nk", field="f")
    assert both.users("model.gemm_nk", (2560, 5120)) == {"Qwen3-32B@tp4", "other@tp4"}
    assert both.users("model.gemm_nk", (10240, 5120)) == {"Qwen3-32B@tp1"}
    # A per-model value serves every TP size of the model; a grid that is not a model's has no users.
    assert both.users("model.hidden", 5120) == {"Qwen3-32B@tp1", "Qwen3-32B@tp4", "Qwen3-32B@tp8", "other@tp4"}
    assert both.users("M_GRID", 8) is None


def test_deepseek_v3_mla_and_moe_projections_at_tp8():
    # hidden 7168, 128 heads, q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, dense intermediate 18432,
    # one shared expert of 2048, 256 routed experts, vocab 129280.
    assert MODELS["DeepSeek-V3"].gemm_projections(8) == [
        ("q_a_proj", 1536, 7168), ("kv_a_proj_with_mqa", 576, 7168), ("fused_qkv_a_proj", 2112, 7168),
        ("q_b_proj", 16 * 192, 1536), ("kv_b_proj", 16 * 256, 512), ("o_proj", 7168, 16 * 128),
        ("gate_up_proj", 2 * 2304, 7168), ("down_proj", 7168, 2304),
        ("shared_experts.gate_up_proj", 2 * 256, 7168), ("shared_experts.down_proj", 7168, 256),
        ("router_gate", 256, 7168), ("lm_head", 16160, 7168)]


def test_moe_model_without_dense_layers_has_no_dense_mlp_gemm():
    names = [name for name, _, _ in MODELS["Qwen3-235B-A22B"].gemm_projections(4)]
    assert names == ["qkv_proj", "o_proj", "router_gate", "lm_head"]
    assert MODELS["Qwen3-235B-A22B"].expert_layouts() == [
        (8, 16, 8, 4096, 1536), (16, 8, 8, 4096, 1536), (32, 4, 8, 4096, 1536), (64, 2, 8, 4096, 1536)]


def test_kv_heads_are_replicated_once_tp_exceeds_them():
    model = MODELS["Qwen3-235B-A22B"]          # 4 KV heads
    assert [model.attention_layout(tp) for tp in (1, 4, 8)] == [(64, 4, 128), (16, 1, 128), (8, 1, 128)]
    assert model.gemm_projections(8)[0] == ("qkv_proj", (8 + 2 * 1) * 128, 4096)


def test_every_shipped_model_loads_with_its_parallel_sizes():
    assert {"opperf-tiny", "Qwen3-32B", "Qwen3-235B-A22B", "DeepSeek-V3", "Llama-3-70B", "Qwen2.5-7B"} <= set(MODELS)
    assert MODELS["DeepSeek-V3"].is_mla and MODELS["DeepSeek-V3"].is_moe
    assert MODELS["Qwen2.5-7B"].head_dim == 128 and MODELS["Llama-3-70B"].num_key_value_heads == 8


def test_target_models_match_names_and_aliases_ignoring_case_and_punctuation():
    chosen = select_models(MODELS, ["dsv3", "QWEN3_32B", "Qwen3-32B"])
    assert [m.name for m in chosen] == ["DeepSeek-V3", "Qwen3-32B"]
    with pytest.raises(OpperfError, match="unknown target model 'gpt5'.*known:"):
        select_models(MODELS, ["gpt5"])


def test_a_directory_named_like_a_model_is_its_key_unless_it_holds_a_config_json(tmp_path, monkeypatch):
    """A `Qwen3-32B/` of results in the working directory leaves `Qwen3-32B` the models.yaml key; a directory
    holding a config.json (a downloaded checkpoint) is that config."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen3-32B").mkdir()
    assert [m.name for m in select_models(MODELS, ["Qwen3-32B"])] == ["Qwen3-32B"]
    checkpoint = tmp_path / "tiny_mixtral"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        (Path(__file__).parent / "data" / "workload" / "tiny_mixtral.json").read_text())
    assert [m.name for m in select_models(MODELS, ["tiny_mixtral"])] == ["hf_tiny_mixtral"]


def test_a_transformers_config_json_is_a_target_model_with_its_own_dims(tmp_path):
    """Mixtral's experts are num_local_experts of intermediate_size each (no dense MLP); Qwen2-MoE's shared expert
    is whole experts of moe_intermediate_size; the name is the file's, as the predictions and reports use it."""
    mixtral, qwen2_moe = select_models(MODELS, ["tests/data/workload/tiny_mixtral.json",
                                                "tests/data/workload/tiny_qwen2_moe.json"])
    assert (mixtral.name, mixtral.num_experts, mixtral.num_experts_per_tok, mixtral.moe_intermediate_size,
            mixtral.has_dense_mlp, mixtral.tp_sizes) == ("hf_tiny_mixtral", 4, 2, 96, False, (1,))
    assert mixtral.expert_layouts() == [(1, 4, 2, 64, 96)]
    assert (qwen2_moe.n_shared_experts, qwen2_moe.moe_intermediate_size, qwen2_moe.head_dim) == (2, 32, 16)
    assert ("shared_experts.gate_up_proj", 128, 64) in qwen2_moe.gemm_projections(1)
    odd = tmp_path / "odd.json"
    odd.write_text('{"model_type": "qwen2_moe", "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 256, '
                   '"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, '
                   '"shared_expert_intermediate_size": 48}')
    with pytest.raises(OpperfError, match="odd.json.*shared_expert_intermediate_size 48 is not a whole number"):
        select_models(MODELS, [str(odd)])


def test_an_olmoe_config_has_the_experts_its_built_model_has():
    """OLMoE's convention (`num_experts` x `intermediate_size`, no moe_intermediate_size): its experts are those of
    the model transformers builds, 8 of width 48, top-2, and no layer runs a dense MLP of its intermediate_size."""
    pytest.importorskip("transformers")
    (olmoe,) = select_models(MODELS, [f"{CONFIGS}/tiny_olmoe.json"])
    experts = built_experts(CONFIGS / "tiny_olmoe.json")
    assert tuple(experts.down_proj.shape) == (8, 64, 48) and tuple(experts.gate_up_proj.shape) == (8, 96, 64)
    assert (olmoe.name, olmoe.num_experts, olmoe.moe_intermediate_size, olmoe.num_experts_per_tok,
            olmoe.n_shared_experts, olmoe.has_dense_mlp) == ("hf_tiny_olmoe", 8, 48, 2, 0, False)
    assert olmoe.expert_layouts() == [(1, 8, 2, 64, 48)]
    assert [name for name, _, _ in olmoe.gemm_projections(1)] == ["qkv_proj", "o_proj", "router_gate", "lm_head"]


def test_experts_come_from_the_built_model_not_from_key_names():
    """ERNIE-4.5-MoE's two shared experts come from transformers' default (no key in the file says so); Gemma-4's
    `num_experts` without its MoE block builds no experts (a dense model); DeepSeek-V2-Lite's first layer is dense."""
    pytest.importorskip("transformers")
    ernie, gemma4, deepseek = select_models(MODELS, ["benchmarks/workloads/tiny/ernie4_5_moe.json",
                                                     "benchmarks/workloads/tiny/gemma4_text.json",
                                                     "benchmarks/workloads/deepseek_v2_lite.json"])
    assert (ernie.num_experts, ernie.moe_intermediate_size, ernie.n_shared_experts) == (4, 32, 2)
    assert not gemma4.is_moe and gemma4.has_dense_mlp and gemma4.intermediate_size == 128
    assert (deepseek.num_experts, deepseek.num_experts_per_tok, deepseek.moe_intermediate_size,
            deepseek.n_shared_experts, deepseek.has_dense_mlp) == (64, 6, 1408, 2, True)


def test_a_checkpoints_config_json_is_named_after_its_folder(tmp_path, monkeypatch):
    """`my_model/config.json` is hf_my_model (not hf_config), so two checkpoints' configs keep apart; a named file
    keeps its stem; two files that would share a name are refused rather than merged."""
    from opperf.model_names import model_reference

    monkeypatch.chdir(tmp_path)
    mistral = (CONFIGS / "tiny_mistral.json").read_text()
    for folder in ("a", "b", "my_model", "x/qwen", "y/qwen"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text(mistral)
    (tmp_path / "qwen3_8b.json").write_text(mistral)
    assert [model_reference(name, MODELS).name for name in ("my_model/config.json", "my_model", "qwen3_8b.json")] == [
        "hf_my_model", "hf_my_model", "hf_qwen3_8b"]
    assert [m.name for m in select_models(MODELS, ["a/config.json", "b/config.json"])] == ["hf_a", "hf_b"]
    reference = model_reference("my_model", MODELS)
    assert (reference.is_config, reference.config_path, reference.given) == (True, Path("my_model/config.json"),
                                                                             "my_model")
    assert model_reference("dsv3", MODELS).name == "DeepSeek-V3" and not model_reference("dsv3", MODELS).is_config
    with pytest.raises(OpperfError, match=r"'x/qwen/config.json' and 'y/qwen' both go by 'hf_qwen'.*rename one"):
        select_models(MODELS, ["x/qwen/config.json", "y/qwen"])


def test_a_mistyped_model_gets_the_closest_name_or_path(tmp_path, monkeypatch):
    from opperf.model_names import model_reference
    from opperf.workload.transformers_model import read_config

    with pytest.raises(OpperfError, match=r"unknown target model 'qwen3-32'; closest: Qwen3-32B; known: "):
        select_models(MODELS, ["qwen3-32"])
    with pytest.raises(OpperfError, match=r"unknown model 'qwen3-mo'; closest: qwen3-moe \(Qwen3-235B-A22B\); known"):
        model_reference("qwen3-mo", "config/models.yaml")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_model").mkdir()
    (tmp_path / "my_model" / "config.json").write_text((CONFIGS / "tiny_mistral.json").read_text())
    with pytest.raises(OpperfError) as raised:
        read_config(model_reference("my_modle/config.json", MODELS).config_path)
    assert str(raised.value) == ("my_modle/config.json: cannot read the model config: No such file or directory; "
                                 "closest: my_model/config.json")
    with pytest.raises(OpperfError, match=r"unknown model 'my_modle'; closest: my_model; known: "):
        model_reference("my_modle", MODELS)
    with pytest.raises(OpperfError, match=r"No such file or directory$"):       # nothing close: no hint
        read_config("elsewhere/config.json")


def test_a_tp_size_splits_a_model_only_where_it_divides_it():
    model = MODELS["Qwen3-235B-A22B"]              # 64 heads, 4 KV heads, experts of 1536
    assert model.splitting_tp_sizes((1, 4, 8, 3, 128)) == ((1, 4, 8), {
        3: "TP size 3 does not divide num_attention_heads 64", 128: "TP size 128 does not divide num_attention_heads 64"})
    narrow = dataclasses.replace(model, num_attention_heads=96, moe_intermediate_size=1540)
    assert narrow.tp_size_problem(3) == "TP size 3 neither divides nor is a multiple of num_key_value_heads 4"
    assert narrow.tp_size_problem(8) == "TP size 8 does not divide moe_intermediate_size 1540"


@pytest.mark.parametrize("field, value, message, named_field", [
    ("tp_sizes", [1, 3], "TP size 3 does not divide num_attention_heads 8", "tp_sizes"),
    ("tp_sizes", [], "must have at least 1 item", "tp_sizes"),
    ("hidden_size", "big", "must be an integer, got 'big'", "hidden_size"),
    ("num_key_value_heads", -4, "must be >= 1, got -4", "num_key_value_heads"),
    ("num_experts", 16, "needs num_experts_per_tok", "num_experts_per_tok"),
    ("num_key_value_head", 4, "unknown key 'num_key_value_head'", "num_key_value_head"),
])
def test_bad_model_fields_name_the_model_and_field(tmp_path, field, value, message, named_field):
    import yaml

    entry = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 4,
             "vocab_size": 4096, "tp_sizes": [1, 2], field: value}
    path = tmp_path / "models.yaml"
    path.write_text(yaml.safe_dump({"tiny": entry}))
    with pytest.raises(OpperfError, match=message) as error:
        load_models(path)
    assert error.value.field == f"tiny.{named_field}"
    # The line of the field, or of its model where the field is missing.
    named_line = path.read_text().splitlines()[error.value.row - 1].strip()
    assert named_line.startswith(f"{named_field}:" if named_field in entry else "tiny:"), named_line


def test_token_counts_sample_both_sides_of_tile_boundaries():
    assert token_counts(16384) == list(range(1, 17)) + [
        31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1023, 1024, 1025,
        2047, 2048, 2049, 4095, 4096, 4097, 8191, 8192, 8193, 16383, 16384]
    assert token_counts(100) == list(range(1, 17)) + [31, 32, 33, 63, 64, 65]
    assert token_counts(4) == [1, 2, 3, 4]


def test_token_axes_meet_the_standard_up_to_the_cap_with_tile_boundaries():
    grids = value_grids([], max_tokens=300, token_axes=["M_GRID", "ATTN_SEQ_GRID"], axis_caps={"NK_GRID": 1024})
    standard_m = [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 192,
                  256, 300]
    assert grids.values("M_GRID", field="f") == sorted(set(standard_m) | set(token_counts(300)))
    assert STANDARD.rule("M_GRID").check(grids.values("M_GRID", field="f")).ok
    # Not a token axis: the standard's points, capped on this back end (ELEM_HIDDEN_GRID is NK_GRID's alias).
    assert grids.values("ELEM_HIDDEN_GRID", field="f") == [128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024]
    assert grids.values("HEADS_GRID", field="f") == [1, 2, 3, 4, 5, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 128]
    assert value_grids([], max_tokens=131072).values("MOE_TOKENS_GRID", field="f")[-1] == 65536


def test_generic_grids_stand_in_when_no_model_is_named():
    grids = value_grids([], generic={"gemm_nk": [(64, 32)]})
    assert grids.values("model.gemm_nk", field="f") == [(64, 32)]
    with pytest.raises(OpperfError, match="needs a target model or a generic.hidden list"):
        grids.values("model.hidden", field="patterns.x.iterators.h")
    tiny = value_grids([MODELS["opperf-tiny"]])
    assert tiny.values("model.gemm_nk", field="f")[:2] == [(512, 256), (256, 256)]
