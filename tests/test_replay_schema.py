"""Schema-driven replay: rows of ops with no kernel definition, built from the op's schema and checked on meta
tensors; value domains that keep every call valid and doing the workload's work."""

from __future__ import annotations

import pytest
import torch

from opperf import contract
from opperf.replay.definitions import load_definition, schema_definition
from opperf.replay.engine import STATUS_NO_DEFINITION, STATUS_OK, replay_row
from opperf.replay.inputs import MetaBuildContext, build_case
from opperf.replay.schema import _Values, bindings, choose_binding, op_packet, recipe_of, routed_offsets
from opperf.replay.timing import CpuProfilerTimer

from conftest import REPO


def row(shapes, dtypes, scalars, outputs, output_dtypes, strides=""):
    return {contract.INPUT_SHAPES: shapes, contract.INPUT_DTYPES: dtypes,
            contract.INPUT_FORMATS: ";".join("ND" if s else "" for s in shapes.split(";")),
            contract.OUTPUT_SHAPES: outputs, contract.OUTPUT_DTYPES: output_dtypes, contract.INPUT_SCALARS: scalars,
            contract.INPUT_STRIDES: strides}


# Rows as the parse writes them from a torch.profiler trace (slots in schema order, keyword-only ones included),
# with the overload the meta check must pick.
ROWS = {
    "cumsum": (row("3;;", "DT_INT64;;", ";0;", "3", "DT_INT64"), "aten::cumsum.default"),
    "histc": (row("8,16;;;", "DT_FLOAT;;;", ";4;0;3", "4", "DT_FLOAT"), "aten::histc.default"),
    "sort": (row("8,16;;", "DT_BF16;;", ";-1;False", "8,16;8,16", "DT_BF16;DT_INT64"), "aten::sort.default"),
    "sort.stable": (row("8,16;;;", "DT_BF16;;;", ";False;-1;True", "8,16;8,16", "DT_BF16;DT_INT64"),
                    "aten::sort.stable"),
    "masked_fill_": (row("8,16;8,16;", "DT_BF16;DT_BOOL;", ";;0.", "8,16", "DT_BF16"), "aten::masked_fill_.Scalar"),
    "random_": (row("5;;;", "DT_FLOAT;;;", ";0;10;", "5", "DT_FLOAT"), "aten::random_.from"),
    "clamp_": (row("6,4;;", "DT_INT64;;", ";0;", "6,4", "DT_INT64"), "aten::clamp_.default"),
    "ge": (row("6,4;", "DT_FLOAT;", ";0.5", "6,4", "DT_BOOL"), "aten::ge.Scalar"),
    "bitwise_and": (row("6,4;6,4", "DT_BOOL;DT_BOOL", ";", "6,4", "DT_BOOL"), "aten::bitwise_and.Tensor"),
    "argmax": (row("4,32;;", "DT_BF16;;", ";-1;False", "4", "DT_INT64"), "aten::argmax.default"),
    "cos": (row("128,64", "DT_BF16", "", "128,64", "DT_BF16"), "aten::cos.default"),
    "index": (row("16,64;32", "DT_FLOAT;DT_INT64", ";", "32,64", "DT_FLOAT"), "aten::index.Tensor"),
    "_index_put_impl_": (row("8,16;3;3,16;;", "DT_BF16;DT_INT64;DT_BF16;;", ";;;False;False", "8,16", "DT_BF16"),
                         "aten::_index_put_impl_.default"),
    "index_select": (row("50,8;;12", "DT_FLOAT;;DT_INT64", ";0;", "12,8", "DT_FLOAT"), "aten::index_select.default"),
    "gather": (row("4,50;;4,7;", "DT_FLOAT;;DT_INT64;", ";1;;False", "4,7", "DT_FLOAT"), "aten::gather.default"),
    "_grouped_mm": (row("12,16;4,16,32;4;;", "DT_BF16;DT_BF16;DT_INT32;;", ";;;;", "12,32", "DT_BF16"),
                    "aten::_grouped_mm.default"),
    "bincount": (row("24;;", "DT_INT64;;", ";;8", "8", "DT_INT64"), "aten::bincount.default"),
    "cat": (row("2,5;3,5;", "DT_BF16;DT_BF16;", ";;0", "5,5", "DT_BF16"), "aten::cat.default"),
}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_every_row_binds_to_the_overload_that_reproduces_it_on_meta_tensors(name):
    fields, overload = ROWS[name]
    kernel_type = name.split(".")[0]
    assert recipe_of(kernel_type, fields, "cpu") == f"schema {overload}"
    case = build_case(schema_definition(kernel_type, ("cpu",)), fields, "cpu")
    result = case.run()
    outputs = result if isinstance(result, (tuple, list)) else (result,)
    expected = [tuple(int(d) for d in s.split(",")) for s in fields[contract.OUTPUT_SHAPES].split(";")]
    assert [tuple(o.shape) for o in outputs] == expected
    assert case.recipe == f"schema {overload}"


def _values(name):
    fields, _ = ROWS[name]
    return build_case(schema_definition(name, ("cpu",)), fields, "cpu", seed=3)


def test_grouped_mm_offsets_are_cumulative_and_end_at_the_token_count():
    offsets = _values("_grouped_mm").args[2]
    assert offsets.dtype == torch.int32 and offsets.tolist() == routed_offsets(12, 4)  # 12 tokens, 4 experts
    assert offsets.tolist() == [2, 6, 8, 12] == _values("_grouped_mm").args[2].tolist()  # seeded: the same split


def test_routed_groups_are_uneven_like_a_router_but_balanced_in_expectation():
    # An even split hands every expert a whole number of GEMM tiles, which no real routing does.
    ends = routed_offsets(1024, 8)
    sizes = [b - a for a, b in zip([0, *ends], ends)]
    assert ends[-1] == 1024 and len(set(sizes)) > 1 and all(96 <= s <= 160 for s in sizes)
    assert routed_offsets(1024, 8) == ends and routed_offsets(1024, 16) != ends


def test_sequence_offsets_stay_even():
    values = _Values.__new__(_Values)
    values.ctx, values.op = type("Ctx", (), {"device": "cpu"})(), "varlen"
    values.partitioned_size = lambda name: 12
    assert values.offsets((4,), torch.int32, "cu_seqlens_q").tolist() == [0, 4, 8, 12]


def test_indices_stay_below_the_dimension_they_index():
    index_select = _values("index_select").args[2]
    assert 0 <= int(index_select.min()) and int(index_select.max()) < 50           # self.shape[dim=0]
    gather = _values("gather").args[2]
    assert int(gather.max()) < 50                                                 # self.shape[dim=1]
    (index,) = _values("index").args[1]
    assert index.shape == (32,) and int(index.max()) < 16
    (put,) = _values("_index_put_impl_").args[1]
    assert int(put.max()) < 8


def test_bincount_input_makes_exactly_the_recorded_number_of_bins():
    case = _values("bincount")
    assert int(case.args[0].max()) == 7 and int(case.args[0].min()) >= 0
    assert tuple(case.run().shape) == (8,)


def test_an_unrecorded_index_list_is_rebuilt_from_the_output_shape():
    # Older parses (and other tools) leave `Tensor?[] indices` as one empty slot: the output says how many rows.
    fields = row("8,16;", "DT_BF16;", ";", "3,16", "DT_BF16")
    case = build_case(schema_definition("index", ("cpu",)), fields, "cpu")
    (index,) = case.args[1]
    assert index.shape == (3,) and int(index.max()) < 8 and tuple(case.run().shape) == (3, 16)


def test_weights_are_cold_and_activations_warm():
    case = _values("_grouped_mm")
    warm = {id(t) for t in case.warm}
    assert id(case.args[0]) in warm and id(case.args[1]) not in warm           # mat2: the experts' weights


def test_recorded_strides_are_kept():
    fields = row("16,8", "DT_FLOAT", "", "16,8", "DT_FLOAT", strides="1,16")
    case = build_case(schema_definition("neg", ("cpu",)), fields, "cpu")
    assert case.args[0].stride() == (1, 16)


def test_a_row_no_overload_reproduces_is_refused_before_anything_runs():
    fields = row("8,16;;", "DT_BF16;;", ";-1;False", "9,16;8,16", "DT_BF16;DT_INT64")        # sort to 9 rows?
    ctx = MetaBuildContext(schema_definition("sort", ("cpu",)), fields, "meta")
    assert [b.name for b in bindings(op_packet("aten::sort"), ctx)] == ["aten::sort.default"]
    with pytest.raises(Exception, match="no overload of aten::sort reproduces the row on meta tensors"):
        choose_binding(op_packet("aten::sort"), fields, ctx, "aten::sort")


def test_replay_records_the_recipe_and_a_definition_that_does_not_fit_falls_back_to_the_schema():
    timer = CpuProfilerTimer()
    fields, _ = ROWS["cos"]
    outcome = replay_row(schema_definition("cos", ("cpu",)), fields, backend="cpu", device="cpu", timer=timer,
                         repeat_count=2, warmup_count=1)
    assert outcome.status == STATUS_OK and outcome.recipe == "schema aten::cos.default"
    mm_out = row("4,8;8,6;4,6", "DT_FLOAT;DT_FLOAT;DT_FLOAT", ";;", "4,6", "DT_FLOAT")           # mm(a, b, out=c)
    outcome = replay_row(load_definition(REPO / "config" / "kernels" / "torch" / "mm.yaml"), mm_out, backend="cpu",
                         device="cpu", timer=timer, repeat_count=2, warmup_count=1)
    assert outcome.status == STATUS_OK
    assert outcome.recipe.startswith("schema aten::mm.out (definition config/kernels/torch/mm.yaml does not fit")
    plain = row("4,8;8,6", "DT_FLOAT;DT_FLOAT", ";", "4,6", "DT_FLOAT")
    outcome = replay_row(load_definition(REPO / "config" / "kernels" / "torch" / "mm.yaml"), plain, backend="cpu",
                         device="cpu", timer=timer, repeat_count=2, warmup_count=1)
    assert outcome.recipe == "definition config/kernels/torch/mm.yaml"
    unknown = replay_row(schema_definition("vllm.rms_norm", ("cpu",)), fields, backend="cpu", device="cpu",
                         timer=timer)
    assert unknown.status == STATUS_NO_DEFINITION and "torch knows no op vllm::rms_norm" in unknown.error


def test_ascend_kernel_types_find_their_op_by_name():
    from opperf.replay.npu.schema_coverage import find_ops, name_candidates

    assert name_candidates("AddRmsNormDynamicQuantAiCore") == ["add_rms_norm_dynamic_quant", "addrmsnormdynamicquant"]
    assert name_candidates("GatherV2AiCore")[0] == "gather" and name_candidates("split_qkv_rmsnorm_rope_kernel_0")[0] \
        == "split_qkv_rmsnorm_rope"
    assert find_ops("LogicalAndAiCore", {}) == ["aten::logical_and"]
    assert find_ops("RmsNorm", {"npu": {"npu_rms_norm"}}) == ["aten::rms_norm", "npu::npu_rms_norm"]
    assert find_ops("reduce_scatterAicpuKernel", {}) == []
