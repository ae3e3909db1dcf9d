"""The CSV contract: shape strings, signatures, column order, kernel type names."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from opperf import contract
from opperf.errors import OpperfError

shapes = st.lists(st.one_of(st.none(), st.lists(st.integers(0, 1 << 11), min_size=1, max_size=4)
                            .map(tuple)), min_size=1, max_size=12)


@given(shapes)
def test_shape_strings_round_trip_with_empty_slots_kept(slot_shapes):
    text = contract.format_shapes(slot_shapes)
    parsed = contract.parse_shapes(text)
    # A single empty slot formats to "" which reads back as no slots: the only lossy case, by design.
    if slot_shapes == [None]:
        assert parsed == []
    else:
        assert parsed == slot_shapes
        assert text.count(";") == len(slot_shapes) - 1


def test_profiler_quotes_and_empty_slots():
    assert contract.parse_shapes('"""81920,4096;8192,512"""') == [(81920, 4096), (8192, 512)]
    assert contract.parse_shapes('"4096,2,512;;;4096,4096;;"') == [(4096, 2, 512), None, None, (4096, 4096),
                                                                    None, None]
    assert contract.parse_shapes('""') == []
    assert contract.parse_shapes(";") == [None, None]


@pytest.mark.parametrize("text, message", [
    ("1,-2", "bad dimension '-2'"),
    ("4096,x", "bad dimension 'x'"),
    ("1e3,4", "bad dimension '1e3'"),
    ("__import__('os')", "bad dimension"),
    ("2199023255553,1", "absurd dimension"),
    ("1048576,1048576,1048576", r"more than 2\*\*44 elements"),
    (",".join(["1"] * 17), "rank 17"),
    ("N/A", "N/A"),
])
def test_bad_shapes_are_rejected_with_file_row_field(text, message):
    with pytest.raises(OpperfError, match=message) as info:
        contract.parse_shapes(text, path="x.csv", row=7, field="Input Shapes")
    assert str(info.value).startswith("x.csv, line 7, field 'Input Shapes': ")


def test_fractal_nz_storage_is_the_nd_matrix():
    # (a, b, c, d) → (b*c, a*d): a 7168x3584 ND weight stored as (224, 448, 16, 16)
    assert contract.fractal_nz_to_nd((224, 448, 16, 16)) == (7168, 3584)
    assert contract.logical_shape((224, 448, 16, 16), "FRACTAL_NZ") == (7168, 3584)
    assert contract.logical_shape((7168, 3584), "ND") == (7168, 3584)


def test_signature_canonicalises_old_spellings():
    new = {"Input Shapes": "136,7168;7168,3584", "Input Data Types": "DT_FLOAT16;DT_FLOAT16",
           "Input Formats": "ND;ND", "Output Shapes": "136,3584", "Output Data Types": "DT_FLOAT16"}
    old = {"Input Shapes": '"""136,7168;7168,3584"""', "Input Data Types": "FLOAT16;FLOAT16",
           "Input Formats": "FORMAT_ND;FORMAT_ND", "Output Shapes": '"136,3584"', "Output Data Types": "FLOAT16"}
    assert contract.row_signature(new) == contract.row_signature(old)
    assert len(contract.row_signature(new)) == 5


def test_dispatch_ffn_combine_signature_includes_ep_size():
    row = {"Input Shapes": "8,7168", "EP Size": "16"}
    assert contract.row_signature(row, "DispatchFFNCombine")[-1] == "16"
    assert contract.row_signature({**row, "EP Size": "16.0"}, "DispatchFFNCombine")[-1] == "16"
    assert contract.row_signature({**row, "EP Size": "8"}, "DispatchFFNCombine") != \
        contract.row_signature(row, "DispatchFFNCombine")


def test_column_order_puts_microbench_before_its_profiling_counter_and_extras_last():
    columns = ["source", "Profiling Average aicore_time(us)", "Input Shapes", "Average Duration(us)",
               "Profiling Std Duration(us)", "MicroBench aicore_time(us)", "OP State", "EP Size",
               "Profiling Average Duration(us)", "Replay Status"]
    assert contract.order_columns(columns) == [
        "OP State", "Input Shapes", "Average Duration(us)", "Profiling Average Duration(us)",
        "Profiling Std Duration(us)", "MicroBench aicore_time(us)", "Profiling Average aicore_time(us)",
        "EP Size", "source", "Replay Status"]


@pytest.mark.parametrize("name", ["../../x", "a/b", "Mat Mul", "MatMül", "", "..", "x\\y"])
def test_hostile_kernel_types_cannot_name_files(name):
    assert contract.kernel_type_problem(name) is not None
    with pytest.raises(OpperfError):
        contract.check_kernel_type(name, path="k.csv", row=3)


@pytest.mark.parametrize("raw, expected", [
    ("split_qkv_rmsnorm_rope_kernel_0", "split_qkv_rmsnorm_rope_kernel"),
    ("muls_add_kernel_1", "muls_add_kernel"),
    ("MatMulV2", "MatMulV2"),
    ("hcom_allReduce_", "hcom_allReduce_"),
])
def test_known_variant_names_are_normalised(raw, expected):
    assert contract.normalise_kernel_type(raw) == expected
    assert contract.kernel_type_problem(expected) is None


def test_dtype_spellings():
    assert contract.canonical_dtype("FLOAT16") == "DT_FLOAT16"
    assert contract.canonical_dtype("DT_BF16") == "DT_BF16"
    assert contract.dtype_bytes("INT64") == 8
    with pytest.raises(OpperfError, match="unknown data type 'DT_FOO'"):
        contract.canonical_dtype("DT_FOO")
