"""Building calls from rows: strict scalars, valid indices, FRACTAL_NZ, layout transforms; output verification."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.definitions import OutputSpec, parse_definition
from opperf.replay.inputs import (build_case, parse_row_slots, parse_scalar, row_tensor_bytes,
                                  storage_extent)
from opperf.replay.verify import verify_outputs


def definition(inputs, **extra):
    raw = {"type": "K", "backends": ["cpu"], "category": "memory", "api": "torch.ops.aten.clone", "inputs": inputs}
    raw.update(extra)
    return parse_definition(raw, "K.yaml")


def row(shapes, dtypes, formats=None, scalars="", out_shapes="", out_dtypes="", out_formats=""):
    return {contract.INPUT_SHAPES: shapes, contract.INPUT_DTYPES: dtypes,
            contract.INPUT_FORMATS: formats if formats is not None else ";".join("ND" for _ in shapes.split(";")),
            contract.INPUT_SCALARS: scalars, contract.OUTPUT_SHAPES: out_shapes, contract.OUTPUT_DTYPES: out_dtypes,
            contract.OUTPUT_FORMATS: out_formats}


@pytest.mark.parametrize("text, value", [
    ("", None), ("None", None), ("-1", -1), ("0.", 0.0), ("1e-06", 1e-06), ("True", True), ("False", False),
    ("[256, 128, 128]", [256, 128, 128]), ("[]", []), ("[-1]", [-1]), ("tanh", "tanh"), ("inf", math.inf),
])
def test_scalar_literals(text, value):
    assert parse_scalar(text) == value


@pytest.mark.parametrize("text", ["__import__('os').system('x')", "[1, [2]]", "1+1", "a b", "{1: 2}", "(1, 2)"])
def test_scalars_are_never_evaluated(text):
    with pytest.raises(OpperfError, match="scalar"):
        parse_scalar(text, field=contract.INPUT_SCALARS)


@given(st.lists(st.integers(-10**12, 10**12), max_size=6))
def test_int_lists_round_trip(values):
    assert parse_scalar(str(values)) == values


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), cols=st.integers(1, 8), count=st.integers(1, 64), dim=st.sampled_from([0, 1, -1]),
       unique=st.booleans())
def test_index_inputs_stay_in_bounds(rows, cols, count, dim, unique):
    spec = definition([{"role": "tensor"}, {"role": "index", "high": {"slot": 0, "dim": dim}, "unique": unique}])
    r = row(f"{rows},{cols};{count}", "DT_FLOAT;DT_INT64")
    bound = (rows, cols)[dim]
    if unique and count > bound:
        with pytest.raises(OpperfError, match="distinct indices do not fit"):
            build_case(spec, r, "cpu")
        return
    case = build_case(spec, r, "cpu")
    index = case.args[1]
    assert index.dtype == torch.int64 and tuple(index.shape) == (count,)
    assert int(index.min()) >= 0 and int(index.max()) < bound
    if unique:
        assert len(set(index.tolist())) == count


def test_index_bound_from_a_scalar_dim():
    spec = definition([{"role": "tensor"}, {"role": "scalar", "from": "input_scalars"},
                       {"role": "index", "high": {"slot": 0, "dim_from_scalar_slot": 1}}])
    case = build_case(spec, row("7,1000;;500", "DT_FLOAT;;DT_INT64", scalars=";1;"), "cpu")
    assert case.args[1] == 1 and int(case.args[2].max()) < 1000 and int(case.args[2].max()) >= 7


def test_fractal_nz_slot_is_built_as_its_nd_matrix_and_handed_to_the_format_cast():
    seen = []
    spec = definition([{"role": "tensor"}])
    r = row("16,8,16,16", "DT_BF16", formats="FRACTAL_NZ")
    ctx_cast = lambda tensor, fmt: seen.append((tuple(tensor.shape), fmt)) or tensor  # noqa: E731
    case = build_case(spec, r, "cpu", format_cast=ctx_cast)
    assert tuple(case.args[0].shape) == (128, 256) and case.args[0].dtype == torch.bfloat16
    assert seen == [((128, 256), "FRACTAL_NZ")]


def test_transpose_dtype_override_fixed_kwargs_and_keyword_slots():
    spec = definition([{"role": "tensor", "transpose": [0, 1]}, {"role": "tensor", "name": "other"},
                       {"role": "scalar", "value": 2.0, "name": "alpha"}],
                      api="torch.add", dtype_overrides={1: "DT_INT8"}, kwargs={"out": None})
    case = build_case(spec, row("3,5;5,3;", "DT_FLOAT;DT_FLOAT;", formats="ND;ND;"), "cpu")
    first = case.args[0]
    assert tuple(first.shape) == (5, 3) and not first.is_contiguous()
    assert case.kwargs["other"].dtype == torch.int8 and case.kwargs["alpha"] == 2.0 and case.kwargs["out"] is None


def test_empty_tensor_slot_uses_the_recorded_scalar_else_a_wrapped_number_or_0d_tensor_else_none():
    spec = definition([{"role": "tensor"}, {"role": "tensor"}, {"role": "tensor"}])
    # double / int64 past self: a wrapped Python number in the workload (`x + eps`), passed as a number
    case = build_case(spec, row("4;;", "DT_FLOAT;DT_DOUBLE;", formats="ND;;", scalars=";;"), "cpu")
    wrapped = case.args[1]
    assert wrapped.dim() == 0 and wrapped.device.type == "cpu" and wrapped.dtype == torch.float64
    assert float(wrapped) == 0.5 and case.args[2] is None
    case = build_case(spec, row("4;;", "DT_FLOAT;DT_INT64;", formats="ND;;", scalars=";;"), "cpu")
    assert case.args[1].dtype == torch.int64 and int(case.args[1]) == 2
    case = build_case(spec, row("4;;", "DT_FLOAT;DT_FLOAT;", formats="ND;;", scalars=";;"), "cpu")
    assert case.args[1].dim() == 0 and case.args[1].dtype == torch.float32
    case = build_case(spec, row(";4;", "DT_INT64;DT_FLOAT;", formats=";ND;", scalars=";;"), "cpu")
    assert isinstance(case.args[0], torch.Tensor) and case.args[0].dim() == 0     # self is never a wrapped number
    case = build_case(spec, row("4;;", "DT_FLOAT;;", formats="ND;;", scalars=";3;"), "cpu")
    assert case.args[1] == 3


def test_slot_count_mismatch_and_unknown_dtype_are_errors_naming_the_field():
    spec = definition([{"role": "tensor"}])
    with pytest.raises(OpperfError, match="2 input slots"):
        build_case(spec, row("4;4", "DT_FLOAT;DT_FLOAT"), "cpu", path="x.csv", line=3)
    with pytest.raises(OpperfError) as error:
        build_case(spec, row("4", "DT_WHAT"), "cpu", path="x.csv", line=3)
    assert error.value.field == contract.INPUT_DTYPES and error.value.row == 3


def test_row_tensor_bytes_counts_logical_shapes():
    r = row("16,8,16,16;4", "DT_BF16;DT_INT8", formats="FRACTAL_NZ;ND", out_shapes="128,256", out_dtypes="DT_FLOAT")
    assert row_tensor_bytes(parse_row_slots(r)) == 128 * 256 * 2 + 4 + 128 * 256 * 4


def verify(r, result, spec=OutputSpec()):
    return verify_outputs(r, parse_row_slots(r), result, spec)


def test_verify_matches_slot_by_slot_and_skips_empty_slots():
    r = row("4", "DT_FLOAT", out_shapes="2,3;;5", out_dtypes="DT_FLOAT;;DT_INT64")
    verdict = verify(r, (torch.zeros(2, 3), None, torch.zeros(5, dtype=torch.int64)))
    assert verdict.ok and verdict.produced == "2,3;;5 | DT_FLOAT;;DT_INT64"


def test_verify_reports_shape_and_dtype_mismatches_with_both_signatures():
    r = row("4", "DT_FLOAT", out_shapes="2,3", out_dtypes="DT_BF16")
    verdict = verify(r, torch.zeros(2, 4))
    assert not verdict.ok
    assert verdict.message == ("output slot 0: shape [2, 4] != expected [2, 3]; "
                               "output slot 0: dtype DT_FLOAT != expected DT_BF16")
    assert verdict.expected == "2,3 | DT_BF16" and verdict.produced == "2,4 | DT_FLOAT"


def test_verify_normalises_fractal_nz_and_flags_missing_or_extra_outputs():
    r = row("4", "DT_FLOAT", out_shapes="16,8,16,16", out_dtypes="FLOAT16", out_formats="FRACTAL_NZ")
    assert verify(r, torch.zeros(128, 256, dtype=torch.float16)).ok
    assert "produced nothing" in verify(r, None).message
    two = (torch.zeros(128, 256, dtype=torch.float16), torch.zeros(3))
    assert "2 outputs" in verify(r, two).message
    assert verify(r, two, OutputSpec(extra="ignore")).ok


def test_formats_are_read_in_one_spelling_whatever_the_profiler_wrote():
    r = row("16,8,16,16", "DT_BF16", formats="format_fractal_nz", out_shapes="16,8,16,16", out_dtypes="DT_BF16",
            out_formats="FORMAT_FRACTAL_NZ")
    slots = parse_row_slots(r)
    assert (slots.input_formats, slots.output_formats) == (["FRACTAL_NZ"], ["FRACTAL_NZ"])
    assert verify(r, torch.zeros(128, 256, dtype=torch.bfloat16)).ok       # compared as the ND matrix


# --- layouts recorded as Input Strides ------------------------------------------------------------------

def test_recorded_strides_are_built_exactly_over_a_storage_that_holds_them():
    spec = definition([{"role": "tensor"}])
    # a chunk of a fused gate_up projection: rows 1376 apart, 688 wide (the CPU workload's silu input)
    case = build_case(spec, {**row("1,16,688", "DT_FLOAT"), contract.INPUT_STRIDES: "22016,1376,1"}, "cpu")
    built = case.args[0]
    assert tuple(built.shape) == (1, 16, 688) and built.stride() == (22016, 1376, 1)
    assert not built.is_contiguous()
    assert built.untyped_storage().nbytes() == storage_extent((1, 16, 688), (22016, 1376, 1)) * 4 == (15 * 1376 + 688) * 4
    # a transpose spec yields to the recorded layout
    spec = definition([{"role": "tensor", "transpose": [0, 1]}])
    case = build_case(spec, {**row("4,8", "DT_FLOAT"), contract.INPUT_STRIDES: "1,4"}, "cpu")
    assert tuple(case.args[0].shape) == (4, 8) and case.args[0].stride() == (1, 4)


def test_an_expanded_index_repeats_its_values_as_the_workloads_did():
    # aten::gather of the CUDA embedding: index [128, 256] with strides [1, 0] (one token id per row)
    spec = definition([{"role": "tensor"}, {"role": "scalar", "from": "input_scalars"},
                       {"role": "index", "high": {"slot": 0, "dim_from_scalar_slot": 1}}], api="torch.ops.aten.gather")
    case = build_case(spec, {**row("4096,256;;128,256", "DT_FLOAT;;DT_INT64", formats="ND;;ND", scalars=";0;"),
                             contract.INPUT_STRIDES: ";;1,0"}, "cpu", seed=3)
    index = case.args[2]
    assert index.stride() == (1, 0) and index.untyped_storage().nbytes() == 128 * 8
    assert bool((index == index[:, :1]).all()) and int(index.max()) < 4096 and int(index.min()) >= 0
    assert index[:, 0].unique().numel() > 1


def test_strides_that_do_not_fit_the_shape_name_the_field():
    spec = definition([{"role": "tensor"}])
    with pytest.raises(OpperfError, match="Input Strides"):
        build_case(spec, {**row("4,8", "DT_FLOAT"), contract.INPUT_STRIDES: "1"}, "cpu", path="x.csv", line=7)


def test_cache_states_mark_weights_cold_and_everything_else_warm():
    spec = definition([{"role": "tensor"}, {"role": "tensor", "cache": "cold"}], api="torch.ops.aten.mm")
    case = build_case(spec, {**row("8,16;16,32", "DT_FLOAT;DT_FLOAT"), contract.INPUT_STRIDES: ";1,16"}, "cpu")
    assert len(case.warm_tensors()) == 1 and case.warm_tensors()[0] is case.args[0]
    assert len(case.tensors()) == 2
    with pytest.raises(OpperfError, match=r"inputs\[0\]\.cache"):
        definition([{"role": "tensor", "cache": "lukewarm"}])
