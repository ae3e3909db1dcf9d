"""grid.yaml validation: a malformed pattern is an error naming the pattern and the field, before any row."""

from __future__ import annotations

import pytest
import yaml

from opperf.errors import OpperfError
from opperf.grid.config import load_grid_config

GOOD = {"iterators": {"m": "tokens", "n": [64, 128]}, "inputs": ["m, n"], "outputs": ["m, n"]}


def write(tmp_path, patterns, router=None, **top):
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump({"patterns": patterns, "router": router or {"Neg": "bad"}, **top},
                                   sort_keys=False))
    return path


@pytest.mark.parametrize("change, field, message", [
    ({"inputs": ["m / 2"]}, "patterns.bad.inputs[0]", "operator '/' is not allowed"),
    ({"inputs": ["m, q"]}, "patterns.bad.inputs[0]", "unknown name 'q'"),
    ({"outputs": ["__import__('os').getcwd()"]}, "patterns.bad.outputs[0]", "is not allowed"),
    ({"constraints": ["m <"]}, "patterns.bad.constraints[0]", "cannot parse"),
    ({"constraints": ["abs(m) > 1"]}, "patterns.bad.constraints[0]", "call of 'abs' is not allowed"),
    ({"iterators": {"m": "no_such_grid"}}, "patterns.bad.iterators.m", "unknown value grid 'no_such_grid'"),
    ({"iterators": {"m": [1, -2]}}, "patterns.bad.iterators.m[1]", "expected a positive integer"),
    ({"iterators": {"n, k": [[1, 2], [3]]}}, "patterns.bad.iterators.n, k", "every value must be a list of 2"),
    ({"constants": {"m": 4}}, "patterns.bad.iterators", "name 'm' is bound twice"),
    ({"constants": {"block": "16"}}, "patterns.bad.constants.block", "must be an integer"),
    ({"inputs": "m, n"}, "patterns.bad.inputs", "must be a list of shape expressions"),
    ({"inputs": ["", ""]}, "patterns.bad.inputs", "at least one tensor slot"),
    ({"match": "loose"}, "patterns.bad.match", "match must be one of"),
    ({"shapes": ["m"]}, "patterns.bad.shapes", "unknown key 'shapes'"),
    ({"iterators": {"m, n": "M_GRID"}}, "patterns.bad.iterators.m, n", "density axis 'M_GRID' gives one value"),
    ({"sweeps": {"s": {"m": "M_GRID"}}}, "patterns.bad.sweeps.s", "a sweep binds the names of the main iterators"),
    ({"sweeps": {"s": {"m": [1], "n": "NO_GRID"}}}, "patterns.bad.sweeps.s.n", "unknown value grid 'NO_GRID'"),
])
def test_malformed_declarative_patterns_name_pattern_and_field(tmp_path, change, field, message):
    pattern = {**GOOD, **change}
    with pytest.raises(OpperfError, match="pattern 'bad'") as error:
        load_grid_config(write(tmp_path, {"bad": pattern}))
    assert error.value.field == field
    assert message in str(error.value)
    assert str(tmp_path / "grid.yaml") in str(error.value)


def test_missing_outputs_is_named(tmp_path):
    pattern = {k: v for k, v in GOOD.items() if k != "outputs"}
    with pytest.raises(OpperfError, match="pattern 'bad' needs 'outputs'") as error:
        load_grid_config(write(tmp_path, {"bad": pattern}))
    assert error.value.field == "patterns.bad.outputs"


@pytest.mark.parametrize("pattern, field, message", [
    ({"generator": "nope"}, "patterns.bad.generator", "unknown generator 'nope'"),
    ({"generator": "moe", "params": {"kernel": "teleport"}}, "patterns.bad.params.kernel", "must be one of"),
    ({"generator": "fused_infer_attention", "params": {"block_size": 0}}, "patterns.bad.params.block_size",
     "must be a positive integer"),
    ({"generator": "rope", "params": {"heads": 4}}, "patterns.bad.params.heads", "unknown param 'heads'"),
    ({"generator": "rope", "inputs": ["m"]}, "patterns.bad.inputs", "a generator pattern takes params"),
])
def test_malformed_generator_patterns_name_pattern_and_field(tmp_path, pattern, field, message):
    with pytest.raises(OpperfError, match="pattern 'bad'") as error:
        load_grid_config(write(tmp_path, {"bad": pattern}))
    assert error.value.field == field and message in str(error.value)


def test_router_to_an_unknown_pattern_is_named(tmp_path):
    with pytest.raises(OpperfError, match="'MatMulV2' routes to unknown pattern 'gemmm'") as error:
        load_grid_config(write(tmp_path, {"gemm": GOOD}, router={"MatMulV2": ["gemm", "gemmm"]}))
    assert error.value.field == "router.MatMulV2"


def test_not_yaml_and_missing_sections_are_errors(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("patterns: [unclosed\n")
    with pytest.raises(OpperfError, match="not valid YAML"):
        load_grid_config(path)
    path.write_text("router: {}\n")
    with pytest.raises(OpperfError, match="missing or not a mapping: 'patterns'"):
        load_grid_config(path)


def test_shipped_grid_config_routes_the_fixture_and_cpu_types():
    config = load_grid_config("config/grid.yaml")
    for kernel_type in ("MatMulV2", "MatMulV3", "FlashAttentionScore", "Add", "FusedInferAttentionScore",
                        "GroupedMatmul", "MoeTokenPermute", "MoeTokenUnpermute", "MoeGatingTopK",
                        "DispatchFFNCombine", "InterleaveRope", "RmsNorm", "SwiGlu", "QuantBatchMatmulV3",
                        "AddRmsNormBias", "DynamicQuant", "AscendQuantV2", "SoftmaxV2", "GatherV2",
                        "ReshapeAndCacheNdKernel", "mm", "addmm", "bmm", "add",
                        "mul", "rsqrt", "mean", "pow", "silu", "_softmax", "embedding", "index_select",
                        "_scaled_dot_product_flash_attention_for_cpu"):
        assert config.patterns_for(kernel_type), kernel_type
    assert config.patterns_for("FlashAttentionScoreGrad") == []
    # NPU/CUDA: every token axis up to the standard's range end; CPU: the demo's declared sub-ranges.
    assert config.max_tokens_for("cpu") == 256 and config.max_tokens_for("npu") == 131072
    assert config.axis_caps_for("cpu") == {"NK_GRID": 4096} and config.axis_caps_for("npu") == {}
    assert not config.tile_boundaries_for("cpu") and config.tile_boundaries_for("npu")
    assert config.standard.version == "v1" and config.standard.source["commit"] == "84fec85"


@pytest.mark.parametrize("top, field, message", [
    ({"axis_caps": {"cpu": {"NO_GRID": 8}}}, "axis_caps.cpu.NO_GRID", "not a grid of the standard"),
    ({"axis_caps": {"cpu": {"ELEM_HIDDEN_GRID": 8}}}, "axis_caps.cpu.ELEM_HIDDEN_GRID", "not a grid of the standard"),
    ({"axis_caps": {"cpu": {"NK_GRID": 0}}}, "axis_caps.cpu.NK_GRID", "expected a positive integer"),
    ({"token_counts": {"axes": ["NO_GRID"]}}, "token_counts.axes", "expected a list of density axes"),
    ({"standard": 3}, "standard", "expected the path of a density standard"),
    ({"token_counts": {"tile_boundaries": {"cpu": "no"}}}, "token_counts.tile_boundaries", "true/false"),
])
def test_bad_density_settings_name_the_field(tmp_path, top, field, message):
    with pytest.raises(OpperfError, match=message) as error:
        load_grid_config(write(tmp_path, {"bad": GOOD}, **top))
    assert error.value.field == field


def test_require_template_is_a_full_match_regular_expression(tmp_path):
    config = load_grid_config(write(tmp_path, {"bad": {**GOOD, "require_template": {"Input Scalars": ";;-1"}}}))
    pattern = config.patterns["bad"]
    assert pattern.accepts({"Input Scalars": ";;-1"})
    assert not pattern.accepts({"Input Scalars": ";;2"}) and not pattern.accepts({})
    with pytest.raises(OpperfError, match="pattern 'bad': bad regular expression") as error:
        load_grid_config(write(tmp_path, {"bad": {**GOOD, "require_template": {"Input Scalars": "(("}}}))
    assert error.value.field == "patterns.bad.require_template.Input Scalars"
