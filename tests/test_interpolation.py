"""The model of msmodeling's interpolation step, on small databases under tests/data/runtime_db.

cuda/: real H100 mm replays (bf16, Qwen3-32B GEMMs); cpu/: rows of the CPU demo database; npu/: Ascend kernel
names and spellings over H100 values plus constructed rows for the paths those do not reach (see its
op_mapping.yaml). Expected values are the runtime's rule written out: linear between the nearest lower and
upper coordinates. tests/test_interpolation_msmodeling.py checks the same model against msmodeling's code.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from opperf.consumer.interpolation import (
    AttentionArgs,
    Database,
    Query,
    TensorSpec,
    as_runtime_reads,
    execution_branch,
    holdout_errors,
    holdout_summary,
    interpolate,
    layout_class,
    query_dtype,
    single_axis,
)
from opperf.consumer.runtime import runtime_nz_to_nd
from opperf.errors import OpperfError
from opperf.io import read_database_csv

DATA = Path(__file__).parent / "data" / "runtime_db"
REPO = Path(__file__).resolve().parents[1]
BF16 = torch.bfloat16


def linear(x, x0, y0, x1, y1):
    return y0 + (x - x0) / (x1 - x0) * (y1 - y0)


def mm(m, k, n, dtype=BF16, lead=()):
    return Query("aten.mm.default", (TensorSpec((*lead, m, k), dtype), TensorSpec((k, n), dtype)),
                 (TensorSpec((*lead, m, n), dtype),))


def add(shape, other, dtype=BF16):
    return Query("aten.add.Tensor", (TensorSpec(shape, dtype), TensorSpec(other, dtype)), (TensorSpec(shape, dtype),))


def attention(batch, seq, kv_heads=8):
    query = TensorSpec((batch, 64, 1, 128), BF16)
    key = TensorSpec((batch, kv_heads, seq, 128), BF16)
    return Query("tensor_cast.attention.default", (query, key, key), (query,),
                 AttentionArgs(query, key, tuple([seq] * batch)))


def embedding(tokens):
    return Query("aten.embedding.default", (TensorSpec((151936, 5120), BF16), TensorSpec((1, tokens), torch.int64)),
                 (TensorSpec((1, tokens, 5120), BF16),))


def with_policy(name: str, tmp_path: Path, policy: dict) -> Database:
    target = tmp_path / name
    shutil.copytree(DATA / name, target)
    mapping = yaml.safe_load((target / "op_mapping.yaml").read_text())
    mapping["interpolation_policy"] = {"kernel_overrides": policy}
    (target / "op_mapping.yaml").write_text(yaml.safe_dump(mapping))
    return Database.load(target)


# --- generic compute (torch kernel names: mm, add, SDPA) -------------------------------------------------------

def test_generic_compute_interpolates_the_leading_dim_between_real_h100_rows():
    answer = Database.load(DATA / "cuda").interpolate(mm(300, 5120, 10240))
    # lines 2 and 6: M=128 (40.628633 us) and M=512 (69.268867 us) of K=5120, N=10240
    assert (answer.status, answer.axes, answer.lines) == ("INTERPOLATED", ("axis_0",), (2, 6))
    assert answer.latency_us == pytest.approx(linear(300, 128, 40.628633, 512, 69.268867), rel=1e-12)


def test_generic_compute_files_an_m1_row_under_its_k_so_small_m_misses():
    cuda = Database.load(DATA / "cuda")
    # (1, 5120) loses its leading 1: axis 5120, alone in its group; M=4 has no M=1 neighbour below.
    assert cuda.interpolate(mm(1, 5120, 10240)).reason == "insufficient_filtered_candidates"
    assert (cuda.interpolate(mm(4, 5120, 10240)).status, cuda.interpolate(mm(4, 5120, 10240)).reason) == (
        "MISS", "outside_axis_boundary")


def test_generic_compute_never_interpolates_a_binary_op_whose_second_input_carries_the_axis():
    # add((1,T,256), (1,T,256)): the second input's full shape is part of the group, so each T is its own group.
    answer = Database.load(DATA / "cpu").interpolate(add((1, 40, 256), (1, 40, 256), torch.float32))
    assert (answer.status, answer.reason) == ("MISS", "regime_key_unmatched")


def test_unknown_dtype_spelling_leaves_no_target():
    # float64 has no runtime spelling: the target cannot be built.
    answer = Database.load(DATA / "cpu").interpolate(mm(40, 256, 512, torch.float64))
    assert (answer.status, answer.reason) == ("MISS", "compute_target_unavailable")


def test_dtype_spellings_go_by_name_so_a_database_check_starts_without_torch():
    """The runtime's spelling of a query's dtype, from the torch dtype or its name alike (float16 shares BF16's,
    float64 has none); the database check and the grid load without torch (2.5 s of every such job's start)."""
    import subprocess
    import sys

    for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int64, torch.bool):
        assert query_dtype(dtype) == query_dtype(str(dtype).removeprefix("torch."))
    assert query_dtype(torch.bfloat16) == query_dtype(torch.float16) == "DT_BF16"
    assert query_dtype(torch.float64) is None and query_dtype(torch.float64, "torch.float64") == "torch.float64"
    loaded = subprocess.run([sys.executable, "-c", "import sys, opperf.database.report, opperf.grid.runner; "
                             "print('torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


# --- the MatMul path ------------------------------------------------------------------------------------------

def test_matmul_interpolates_m_with_k_and_n_fixed_and_duplicates_by_median():
    answer = Database.load(DATA / "npu").interpolate(mm(700, 5120, 10240))
    middle = (69.268867 + 71.2) / 2          # lines 5 and 6 are both M=512
    assert (answer.status, answer.axes, answer.lines) == ("INTERPOLATED", ("M",), (5, 6, 7))
    assert answer.latency_us == pytest.approx(linear(700, 512, middle, 1024, 138.471533), rel=1e-12)


def test_matmul_v2_mixes_float_and_bf16_rows_which_is_illegal():
    answer = Database.load(DATA / "npu").interpolate(mm(300, 5120, 10240))
    assert (answer.status, answer.lines) == ("ILLEGAL", (5, 6, 18))      # line 18: a FLOAT row at M=256
    assert answer.latency_us == pytest.approx(linear(300, 256, 55.0, 512, (69.268867 + 71.2) / 2), rel=1e-12)
    assert "FLOAT" in answer.reason


def test_matmul_combining_nk_and_kn_weight_rows_is_illegal():
    answer = Database.load(DATA / "npu").interpolate(mm(300, 25600, 5120))
    assert (answer.status, answer.lines) == ("ILLEGAL", (15, 17))
    assert answer.latency_us == pytest.approx(linear(300, 128, 103.022867, 512, 178.688533), rel=1e-12)
    assert "layouts" in answer.reason


def test_matmul_without_policy_falls_to_3d_griddata_and_a_policy_caps_it(tmp_path):
    pytest.importorskip("scipy")
    free = Database.load(DATA / "npu").interpolate(mm(100, 5120, 5120))
    assert (free.status, free.method, free.axes) == ("ILLEGAL", "griddata_linear", ("M", "K", "N"))
    capped = with_policy("npu", tmp_path, {"MatMulV2": {"max_interpolation_dim": 1}}).interpolate(
        mm(100, 5120, 5120))
    assert (capped.status, capped.reason) == ("MISS", "insufficient_filtered_candidates")


def test_replayed_and_profiled_latencies_are_never_combined():
    # M=4096 has only a profiled latency (line 9): the replayed rows around M=5000 are used, not it.
    answer = Database.load(DATA / "npu").interpolate(mm(5000, 5120, 10240))
    assert answer.lines == (10, 19)
    assert answer.latency_us == pytest.approx(linear(5000, 3000, 400.0, 8192, 1086.7499), rel=1e-12)


# --- elementwise -----------------------------------------------------------------------------------------------

def test_elementwise_interpolates_elements_moved_within_one_hidden_size():
    answer = Database.load(DATA / "npu").interpolate(add((1, 300, 5120), (1, 300, 5120)))
    io = 3 * 5120
    assert (answer.status, answer.lines) == ("INTERPOLATED", (3, 4))
    assert answer.latency_us == pytest.approx(linear(300 * io, 128 * io, 1.858133, 512 * io, 3.8997), rel=1e-12)


def test_elementwise_across_hidden_sizes_is_illegal():
    answer = Database.load(DATA / "npu").interpolate(add((1, 100, 4096), (1, 100, 4096)))
    assert (answer.status, answer.lines) == ("ILLEGAL", (2, 9))       # (1,5120) and (64,8192) rows
    assert answer.latency_us == pytest.approx(linear(100 * 4096 * 3, 5120 * 3, 1.204333, 64 * 8192 * 3, 2.1))


def test_elementwise_broadcast_rows_form_their_own_group():
    answer = Database.load(DATA / "npu").interpolate(add((1, 1000, 5120), (5120,)))
    assert (answer.status, answer.lines) == ("INTERPOLATED", (11, 12))
    io = 2 * 5120
    assert answer.latency_us == pytest.approx(
        linear(1000 * io + 5120, 512 * io + 5120, 3.5, 2048 * io + 5120, 15.0), rel=1e-12)


# --- attention and output_numel --------------------------------------------------------------------------------

def test_attention_interpolates_seq_linearly_or_in_sqrt_seq_by_policy(tmp_path):
    linear_answer = Database.load(DATA / "npu").interpolate(attention(1, 3000))
    assert (linear_answer.status, linear_answer.axes, linear_answer.lines) == ("INTERPOLATED", ("seq",), (5, 6))
    assert linear_answer.latency_us == pytest.approx(linear(3000, 2048, 21.0, 8192, 70.0), rel=1e-12)
    root = with_policy("npu", tmp_path, {"FusedInferAttentionScore": {"axis_transform": "sqrt_seq"}})
    sqrt_answer = root.interpolate(attention(1, 3000))
    assert sqrt_answer.latency_us == pytest.approx(
        linear(math.sqrt(3000), math.sqrt(2048), 21.0, math.sqrt(8192), 70.0), rel=1e-12)


def test_attention_across_batch_and_seq_at_once_is_illegal():
    pytest.importorskip("scipy")
    answer = Database.load(DATA / "npu").interpolate(attention(16, 2000))
    assert (answer.status, answer.axes) == ("ILLEGAL", ("seq", "batch"))


def test_output_numel_policy_interpolates_an_embedding_by_output_size(tmp_path):
    assert Database.load(DATA / "npu").interpolate(embedding(500)).reason == "regime_key_unmatched"
    root = with_policy("npu", tmp_path, {"GatherV2": {"generic_compute": {"axis": "output_numel"}}})
    answer = root.interpolate(embedding(500))
    assert (answer.status, answer.axes, answer.lines) == ("INTERPOLATED", ("output_numel",), (4, 5))
    assert answer.latency_us == pytest.approx(linear(500 * 5120, 128 * 5120, 9.5, 1024 * 5120, 40.0), rel=1e-12)


def test_paths_the_model_does_not_follow_say_so():
    op_mapping = {"operator_mappings": {"x.moe.default": {"kernel_type": "DispatchFFNCombine",
                                                          "query_mode": "moe_fused"},
                                        "x.mla.default": {"composite": True}}}
    for name in ("x.moe.default", "x.mla.default"):
        assert interpolate({}, Query(name, ()), op_mapping).status == "UNMODELLED"
    assert interpolate({}, Query("aten.unknown.default", ()), op_mapping).reason == "wrapper_unmapped"


# --- reading cells as the runtime does --------------------------------------------------------------------------

def test_an_empty_shape_cell_makes_the_runtime_raise(tmp_path):
    rows = read_database_csv(DATA / "npu" / "Add.csv")
    rows.loc[1, "Input Shapes"] = ""           # the profiler's scalar add: no shape text at all
    op_mapping = yaml.safe_load((DATA / "npu" / "op_mapping.yaml").read_text())
    answer = interpolate({"Add": rows}, add((1, 300, 5120), (1, 300, 5120)), op_mapping)
    assert answer.status == "RAISES" and "line 3, field 'Input Shapes'" in answer.reason
    with pytest.raises(OpperfError, match="Add.csv line 3, field .Input Shapes.: .* empty cell"):
        holdout_errors(rows, "Add", op_mapping)


def test_runtime_reads_numbers_where_pandas_guesses_them():
    frame = pd.DataFrame({"Output Shapes": ["4096", ""], "Input Shapes": ["4096", "8"]})
    seen = as_runtime_reads(frame)
    assert str(seen.loc[0, "Output Shapes"]) == "4096.0" and str(seen.loc[0, "Input Shapes"]) == "4096"


def test_single_axis():
    assert single_axis([(300, 5120), (300, 5120)], [(128, 5120), (128, 5120)])
    assert not single_axis([(100, 4096)], [(64, 8192)])
    assert single_axis([(7, 7)], [(9, 9)]) and not single_axis([(7, 7)], [(9, 8)])
    assert not single_axis([(4, 5)], [(4, 5, 1)])


# --- holdout ---------------------------------------------------------------------------------------------------

def test_holdout_predicts_each_interior_row_from_its_neighbours_on_real_h100_rows():
    rows = read_database_csv(DATA / "cuda" / "mm.csv")
    op_mapping = yaml.safe_load((DATA / "cuda" / "op_mapping.yaml").read_text())
    points = holdout_errors(rows, "mm", op_mapping)
    point = next(p for p in points if p.lines == (6,))                  # M=512 of K=5120, N=10240
    predicted = linear(512, 128, 40.628633, 1024, 138.471533)
    assert (point.axis, point.lower, point.upper, point.legal) == ("axis_0", 128.0, 1024.0, True)
    assert point.predicted_us == pytest.approx(predicted, rel=1e-12)
    assert point.relative_error == pytest.approx(abs(predicted - 69.268867) / 69.268867, rel=1e-12)
    # The M=1 rows are not in the M buckets (their leading 1 is dropped): they are never held out.
    assert all(p.value > 1 for p in points)
    summary = holdout_summary(points)
    assert summary["count"] == len(points) == 28
    assert summary["median"] == pytest.approx(statistics.median(p.relative_error for p in points), rel=1e-12)


def test_holdout_flags_predictions_from_another_bucket():
    rows = read_database_csv(DATA / "npu" / "MatMulV2.csv")
    op_mapping = yaml.safe_load((DATA / "npu" / "op_mapping.yaml").read_text())
    points = {p.lines: p for p in holdout_errors(rows, "MatMulV2", op_mapping)}
    assert points[(3,)].legal and (points[(3,)].lower, points[(3,)].upper) == (1.0, 128.0)     # M=8
    assert not points[(4,)].legal and points[(4,)].upper == 256.0     # M=128's upper neighbour is a FLOAT row
    assert holdout_summary([]) == {"count": 0, "median": None, "p90": None}


def test_fractal_nz_is_restored_the_runtimes_way():
    # (..., H, W, bh, bw) -> (..., H*bw, W*bh): the NZ weight row of MatMulV2.csv (line 22) reads as (3072, 4096).
    assert runtime_nz_to_nd((192, 256, 16, 16)) == (3072, 4096) and runtime_nz_to_nd((7, 5)) == (7, 5)


def test_rows_that_broadcast_other_operands_are_another_bucket():
    """mul of (1, H, 257, 128) by a (1, 1, 257, 128) rotary table, replayed on an H100
    (benchmarks/results/cuda_database/): at H = 1 nothing is broadcast and TensorIterator runs its same-shape kernel
    (1.26 µs), from H = 2 its broadcasting one (2.5 µs). The V1 standard's strict signature keeps that fixed in a
    bucket: H = 2 is not predicted from H = 1, a query between them is ILLEGAL, one between 2 and 4 is not."""
    latency = {64: 6.214633, 32: 3.6918, 16: 2.788267, 8: 2.506733, 4: 2.499233, 2: 2.530167, 1: 1.256567}
    rows = pd.DataFrame([{"OP State": "eager", "Accelerator Core": "CUDA", "Input Shapes": f'"1,{h},257,128;1,1,257,128"',
                          "Input Data Types": "DT_BF16;DT_BF16", "Input Formats": "ND;ND",
                          "Output Shapes": f'"1,{h},257,128"', "Output Data Types": "DT_BF16", "Output Formats": "ND", "Duration(us)": str(us)}
                         for h, us in latency.items()])
    mapping = {"operator_mappings": {"aten.mul.Tensor": {"kernel_type": "mul", "category": "elementwise"}}}
    points = {p.value: p for p in holdout_errors(rows, "mul", mapping)}
    assert not points[2.0].legal and points[2.0].lower == 1.0            # predicted 1.67 µs from H = 1 and 4
    assert points[2.0].relative_error == pytest.approx(abs(linear(2, 1, 1.256567, 4, 2.499233) - 2.530167) / 2.530167)
    assert all(points[h].legal for h in (4.0, 8.0, 16.0, 32.0))

    def mul(h):
        return Query("aten.mul.Tensor", (TensorSpec((1, h, 257, 128), BF16), TensorSpec((1, 1, 257, 128), BF16)),
                     (TensorSpec((1, h, 257, 128), BF16),))

    three = interpolate({"mul": rows}, mul(3), mapping)
    assert (three.status, three.latency_us) == ("INTERPOLATED", pytest.approx(linear(3, 2, 2.530167, 4, 2.499233)))
    without_two = interpolate({"mul": rows[rows["Input Shapes"] != '"1,2,257,128;1,1,257,128"']}, mul(2), mapping)
    assert without_two.status == "ILLEGAL" and "broadcast operands" in without_two.reason


# --- execution branches (rows a holdout may not combine: interpolation.execution_branch) ------------------------

def _generic_rows(shapes_latency: dict[str, float], strides: dict[str, str] | None = None) -> pd.DataFrame:
    return pd.DataFrame([{"OP State": "eager", "Accelerator Core": "CUDA", "Input Shapes": f'"{shape}"',
                          "Input Data Types": "DT_BF16", "Input Formats": "ND", "Output Shapes": f'"{shape}"',
                          "Output Data Types": "DT_BF16", "Output Formats": "ND", "Duration(us)": str(us),
                          "Input Strides": (strides or {}).get(shape, "")}
                         for shape, us in shapes_latency.items()])


def _mapping(kernel_type: str, category: str, backend: str | None = "cuda") -> dict:
    mapping = {"operator_mappings": {f"aten.{kernel_type}.default": {"kernel_type": kernel_type, "category": category}}}
    if backend:
        mapping["opperf"] = {"backend": backend, "kernel_types": {kernel_type: {"category": category}}}
    return mapping


def test_the_vectorised_kernels_tail_is_another_branch_than_whole_blocks():
    """rsqrt of (1, N, 1) bf16, replayed on an H100 (benchmarks/results/cuda_database/): whole 1,024-element blocks
    run PyTorch's vectorised loop only (4,096: 1.19 µs), any remainder also its scalar tail (4,095: 1.49 µs). 4,096
    predicted from 4,095 and 4,097 mixes the two and is ILLEGAL; 3,000 from 2,049 and 4,095 (all with a tail) is
    legal. Only CUDA declares the block: the same rows of a CPU database are one branch."""
    latency = {1000: 1.5606, 1023: 1.566933, 1024: 1.256467, 1025: 1.230867, 2047: 1.4529, 2048: 1.218267,
               2049: 1.276667, 3000: 1.5018, 4095: 1.4891, 4096: 1.192467, 4097: 1.273433}
    rows = _generic_rows({f"1,{n},1": us for n, us in latency.items()})
    points = {p.value: p for p in holdout_errors(rows, "rsqrt", _mapping("rsqrt", "elementwise"))}
    whole = points[4096.0]
    assert (whole.lower, whole.upper, whole.legal, whole.crosses_branch) == (4095.0, 4097.0, False, True)
    assert whole.relative_error == pytest.approx(abs(linear(4096, 4095, 1.4891, 4097, 1.273433) - 1.192467) / 1.192467)
    tail = points[3000.0]
    assert (tail.lower, tail.upper, tail.legal, tail.crosses_branch) == (2049.0, 4095.0, True, False)
    assert tail.predicted_us == pytest.approx(linear(3000, 2049, 1.276667, 4095, 1.4891))
    assert sorted(v for v, p in points.items() if p.legal) == [3000.0]
    for mapping in (_mapping("rsqrt", "elementwise", "cpu"), _mapping("rsqrt", "elementwise", None),
                    _mapping("rsqrt", "reduction")):
        assert all(p.legal and not p.crosses_branch for p in holdout_errors(rows, "rsqrt", mapping))


def test_rows_read_through_another_buffer_layout_are_another_branch():
    """neg of a rope slice (1, h, 6000, 64) of DeepSeek-V3's fused buffer, one row per TP size, replayed on an H100:
    h = 2, 4, 8 read a buffer 10x the slice's width, h = 16, 32, 64 one 1.25x. 16 heads predicted from 8 and 32
    (19.1 µs against 14.9) crosses layouts and is ILLEGAL; 32 from 16 and 64, and 4 from 2 and 8, are legal."""
    latency = {1: 2.581433, 2: 3.638533, 4: 5.833733, 8: 10.4142, 16: 14.878267, 32: 36.830833, 64: 69.701067}
    token_stride = {1: 1280, 2: 2560, 4: 5120, 8: 10240, 16: 2560, 32: 5120, 64: 10240}
    rows = _generic_rows({f"1,{h},6000,64": us for h, us in latency.items()},
                         {f"1,{h},6000,64": f"{6000 * s},128,{s},1" for h, s in token_stride.items()})
    points = {p.value: p for p in holdout_errors(rows, "neg", _mapping("neg", "elementwise"))}
    assert (points[16.0].legal, points[16.0].crosses_branch) == (False, True)
    assert points[16.0].predicted_us == pytest.approx(linear(16, 8, 10.4142, 32, 36.830833))
    assert points[32.0].legal and points[32.0].relative_error == pytest.approx(
        abs(linear(32, 16, 14.878267, 64, 69.701067) - 36.830833) / 36.830833)
    assert points[4.0].legal and not points[2.0].legal       # h = 1 has no heads dim to read through: its own layout
    assert layout_class((1, 2, 6000, 64), (15360000, 128, 2560, 1)) == ((3, 1.0), (1, 2.0), (2, 10.0))
    assert layout_class((1, 8, 6000, 64), (61440000, 128, 10240, 1)) == ((3, 1.0), (1, 2.0), (2, 10.0))
    assert layout_class((1, 16, 6000, 64), (15360000, 128, 2560, 1)) == ((3, 1.0), (1, 2.0), (2, 1.25))
    assert layout_class((4, 8), (8, 1)) == layout_class((4, 8), None) == "packed"
    assert layout_class((4, 8), (0, 1)) == ((0, 0.0), (1, 1.0))               # broadcast along dim 0


def test_a_dense_copys_memcpy_path_is_its_branch():
    """clone of DeepSeek-V3's (1, h, 1, 1000, 56) rope slice, heads-major over a (1000, h, 56) buffer (dense, not
    packed), replayed on an H100 (benchmarks/results/cuda_database/, lines 169-248): ATen copies it with one device
    memcpy, whose path is set by the byte count (benchmarks/results/memcpy_tail/). h = 8 is under 1 MiB; h = 16
    (1,792,000 B) is past it with a remainder of 4 KiB pages (3.94 µs); h = 32, 64, 128 are whole pages (2.26 µs
    at h = 32). Predicting 16 or 32 across that boundary is ILLEGAL; 64 from 32 and 128 is legal. Without the
    definition's `memcpy_when_dense` (another op's rows, a CPU database) they are one branch, as before."""
    latency = {8: 1.573333, 16: 3.939233, 32: 2.2625, 64: 3.875367, 128: 6.7841}
    rows = _generic_rows({f"1,{h},1,1000,56": us for h, us in latency.items()},
                         {f"1,{h},1,1000,56": f"{56000 * h},56,{56000 * h},{56 * h},1;" for h in latency})
    mapping = _mapping("clone", "memory")
    mapping["opperf"]["kernel_types"]["clone"]["memcpy_when_dense"] = True
    points = {p.value: p for p in holdout_errors(rows, "clone", mapping)}
    assert {v: (p.legal, p.crosses_branch) for v, p in points.items()} == {
        16.0: (False, True), 32.0: (False, True), 64.0: (True, False)}
    assert points[64.0].relative_error == pytest.approx(abs(linear(64, 32, 2.2625, 128, 6.7841) - 3.875367) / 3.875367)
    assert all(p.legal for p in holdout_errors(rows, "clone", _mapping("clone", "memory")))
    assert all(p.legal for p in holdout_errors(rows, "clone", {**mapping, "opperf": {
        **mapping["opperf"], "backend": "cpu"}}))
    branch = {h: execution_branch(row, "cuda", "memory", True)[1]
              for h, (_, row) in zip(latency, rows.iterrows())}
    assert branch == {8: ("memcpy", False, True), 16: ("memcpy", True, False), 32: ("memcpy", True, True),
                      64: ("memcpy", True, True), 128: ("memcpy", True, True)}
    # A broadcast input (a KV head expanded over its group) is copied by a kernel: the vector-block rule is not
    # applied (not packed) and neither is the memcpy's.
    expanded = {**rows.iloc[0].to_dict(), "Input Strides": "56000,0,56000,56,1;"}
    assert execution_branch(expanded, "cuda", "memory", True)[1] is None
    # copy_ between two layouts (a strided source into a packed destination) is a kernel too; between one layout
    # of one dtype, a memcpy; of two dtypes, a kernel.
    copy = {**rows.iloc[1].to_dict(), "Input Shapes": '"1,16,1,1000,56;1,16,1,1000,56"',
            "Input Data Types": "DT_BF16;DT_BF16", "Input Strides": ";896000,56,896000,896,1"}
    assert execution_branch(copy, "cuda", "memory", True)[1] is None
    assert execution_branch({**copy, "Input Strides": ""}, "cuda", "memory", True)[1] == ("memcpy", True, False)
    assert execution_branch({**copy, "Input Strides": "", "Input Data Types": "DT_BF16;DT_FLOAT"}, "cuda", "memory",
                            True)[1] is True      # the vector loop's whole blocks: 1,792,000 B = 875 x 2,048


def test_the_memcpy_paths_split_the_measured_copies_where_their_times_step():
    """benchmarks/results/memcpy_tail/H100.json: clone of a packed uint8 tensor at byte counts around 16 sizes from
    256 KiB to 64 MiB, each a device memcpy. Every count on its size's branch runs within 10 % of the size itself;
    every count on another branch at least 5 % slower (2.4-3.5x from 1 MiB to 2 MiB, 1.07x at 64 MiB)."""
    measured = json.loads((REPO / "benchmarks/results/memcpy_tail/H100.json").read_text())
    copies = {r["bytes"]: r["median_us"] for r in measured["rows"] if r["set"] == "bytes"}
    assert all(set(r["activities"]) == {"Memcpy DtoD (Device -> Device)"} for r in measured["rows"]
               if r["set"] == "bytes")

    def branch(size: int) -> tuple:
        row = {"Input Shapes": f'"{size}"', "Input Data Types": "DT_UINT8", "Output Shapes": f'"{size}"',
               "Output Data Types": "DT_UINT8", "Input Strides": ""}
        return execution_branch(row, "cuda", "memory", True)[1]

    sizes = [s for s in copies if s + 2 in copies]          # each size, then 2 B ... 64 KiB more
    same, other = [], []
    for size in sizes:
        for near in (n for n in copies if size <= n <= size + 65536):
            (same if branch(near) == branch(size) else other).append(copies[near] / copies[size])
    assert len(sizes) == 16 and (len(same), len(other)) == (4 * 11 + 12 * 4, 4 * 1 + 12 * 8)
    assert max(abs(r - 1) for r in same) < 0.10 and min(other) > 1.05
    assert branch(983040) == ("memcpy", False, True) and branch(1 << 20) == ("memcpy", True, True)
    assert copies[1 << 20] < 0.8 * copies[983040]          # the large path from 1 MiB: faster than 960 KiB
