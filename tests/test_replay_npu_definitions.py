"""Every NPU kernel definition loads, and its inputs build on the CPU with the row's shapes and dtypes.

The APIs themselves (torch_npu, vLLM-Ascend custom ops) exist only on an Ascend host: here the
tensors are built on the CPU and compared with the row, slot by slot; the API is never called.
"""

from __future__ import annotations

import csv
import importlib
from pathlib import Path

import pytest
import torch

from opperf import contract
from opperf.errors import OpperfError
from opperf.replay.definitions import definition_for, load_definitions
from opperf.replay.hooks.npu_common import NpuCall, to_case
from opperf.replay.inputs import BuildContext, build_argument, torch_dtype
from opperf.replay.npu import environment

REPO = Path(__file__).resolve().parents[1]
NPU_DEFINITIONS = REPO / "config" / "kernels" / "npu"
EXAMPLE_ROWS = Path(__file__).parent / "data" / "replay_npu" / "example_rows.csv"
# The NPU list: the seed's kernels plus the MoE / batched-matmul / cast additions.
REQUIRED_TYPES = {
    "MatMulV2", "MatMulV3", "MatMulCommon", "QuantBatchMatmulV3", "AscendQuantV2", "DynamicQuant",
    "FusedInferAttentionScore", "RmsNorm", "AddRmsNormBias", "InterleaveRope", "split_qkv_rmsnorm_rope_kernel",
    "ReshapeAndCacheNdKernel", "KvRmsNormRopeCache", "SwiGlu", "SoftmaxV2", "TensorMove", "Slice", "PadV3", "Index",
    "GatherV2", "MaskedFill", "Transpose", "Sort", "DispatchFFNCombine", "RINGMLAPrefillBF16Kernel", "ArgMaxV2", "Add",
    "BatchMatMulV2", "TransposeBatchMatMul", "GroupedMatmul", "GroupedMatmulSwigluQuant", "MoeTokenPermute",
    "MoeTokenUnpermute", "ScatterNdUpdate", "Cast",
}
CUSTOM_OPP = {"AddRmsNormBias", "ApplyTopKTopPCustom", "DispatchFFNCombine", "batch_matmul_transpose_0", "KvRmsNormRopeCache", "RINGMLAPrefillBF16Kernel",
              "split_qkv_rmsnorm_rope_kernel"}

DEFINITIONS = load_definitions(NPU_DEFINITIONS, backend="npu")
with open(EXAMPLE_ROWS, newline="", encoding="utf-8") as _handle:
    ROWS = list(csv.DictReader(_handle))


def test_every_required_kernel_type_has_exactly_one_npu_definition():
    covered = {t for d in DEFINITIONS.values() for t in d.kernel_types}
    assert REQUIRED_TYPES <= covered
    assert {d.type for d in DEFINITIONS.values() if d.requires_custom_opp} == CUSTOM_OPP
    assert environment.custom_opp_kernels() == CUSTOM_OPP     # the environment check reads the same flag
    assert set(definition_for(DEFINITIONS, "MatMulV3").kernel_types) == {"MatMulV2", "MatMulV3", "MatMulCommon"}


def test_every_definition_has_an_example_row():
    rowed = {definition_for(DEFINITIONS, row["Type"], "npu").type for row in ROWS}
    assert rowed == set(DEFINITIONS)


def _build(row: dict, line: int | None = None) -> tuple[BuildContext, dict[int, object], NpuCall | None]:
    definition = definition_for(DEFINITIONS, row["Type"], "npu")
    line = line if line is not None else ROWS.index(row) + 2
    ctx = BuildContext(definition, row, "cpu", path=EXAMPLE_ROWS, line=line)
    if definition.hook:
        call = importlib.import_module(definition.hook).build_call(row, ctx)
        return ctx, call.slot_tensors, call
    built = {i: build_argument(spec, i, ctx) for i, spec in enumerate(definition.inputs)}
    return ctx, built, None


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['Type']}-{i}" for i, r in enumerate(ROWS)])
def test_inputs_build_with_the_rows_shapes_and_dtypes(row):
    ctx, built, call = _build(row)
    tensors = {i: v for i, v in built.items() if isinstance(v, torch.Tensor)}
    # Fill and Range take their size from the output: their input slots (dims, value / start, limit, delta)
    # are the kernel's own metadata.
    assert tensors or row["Type"] in ("Fill", "Range"), "nothing was built from the row's slots"
    for index, tensor in tensors.items():
        expected_shape = ctx.input_shape(index)
        if expected_shape is None:
            expected_shape = ()                           # an empty slot is the 0-d scalar operand
        if call is not None and "storage-equivalent" in call.notes and index == 1:
            expected_shape = ctx.input_shape(0)           # AddRmsNormBias' (T, H) residual beside (1, T, H)
        assert tuple(tensor.shape) == expected_shape, f"slot {index}"
        expected_dtype = torch_dtype(ctx.slots.input_dtypes[index])
        assert tensor.dtype == expected_dtype, f"slot {index}"
    if call is not None:
        assert call.api.split(".")[0] in ("torch", "torch_npu")
        assert call.describe().startswith(call.api + "(")
    # Every non-empty slot of the row is either built or is the kernel's own metadata (offsets, perm, axis).
    metadata_slots = {"Slice": {1, 2}, "PadV3": {1}, "Index": {1, 2}, "Transpose": {1}, "ReduceSum": {1}, "Tile": {1},
                      "BroadcastTo": {1}, "Fill": {0, 1}, "Range": {0, 1, 2}}
    filled = {i for i, shape in enumerate(ctx.slots.input_shapes) if shape is not None}
    definition = ctx.definition
    expected_built = filled - metadata_slots.get(definition.type, set())
    assert expected_built <= set(built), f"slots {sorted(expected_built - set(built))} were not built"


def _row(kernel_type: str, position: int = 0) -> dict:
    return [r for r in ROWS if r["Type"] == kernel_type][position]


def test_matmul_weight_is_built_as_stored_and_passed_transposed():
    ctx, built, call = _build(_row("MatMulV2", 1))          # weight recorded (N, K) = (512, 256)
    assert call.api == "torch.mm"
    a, b = call.args
    assert tuple(built[1].shape) == (512, 256) and tuple(b.shape) == (256, 512)
    assert torch.mm(a.float(), b.float()).shape == (16, 512)   # the CPU stand-in shows the call is well formed


def test_fractal_nz_weight_is_built_as_its_nd_matrix():
    ctx, built, call = _build(_row("MatMulV3"))
    assert ctx.input_shape(1) == (256, 512)
    assert tuple(call.args[1].shape) == (256, 512)


def test_index_like_inputs_hold_valid_indices():
    _, built, _ = _build(_row("ReshapeAndCacheNdKernel"))
    slots_written = built[4]
    assert slots_written.unique().numel() == 16 and int(slots_written.max()) < 32 * 128
    _, built, _ = _build(_row("KvRmsNormRopeCache"))
    assert built[4].unique().numel() == 16 and int(built[4].max()) < 32 * 128
    _, built, _ = _build(_row("MoeTokenUnpermute"))
    assert sorted(built[1].tolist()) == list(range(128))   # a true permutation
    _, built, _ = _build(_row("GatherV2"))
    assert int(built[1].min()) >= 0 and int(built[1].max()) < 1024
    _, built, _ = _build(_row("ScatterNdUpdate"))
    assert built[1].unique().numel() == 16 and int(built[1].max()) < 64
    _, built, call = _build(_row("DispatchFFNCombine"))
    assert int(built[3].max()) < 4 * 4                        # local experts x EP size
    # The HCCL group is joined only on the device; until then `group` is an empty name (the schema requires it).
    assert call.prepare is not None and call.kwargs["group"] == ""
    assert "bias1" not in call.kwargs and "expert_token_nums" in call.kwargs     # vllm-ascend 0.18.0's schema


def test_grouped_matmul_group_list_sums_to_the_tokens():
    _, built, call = _build(_row("GroupedMatmul"))
    assert built[2].tolist() == [8] * 8 and call.kwargs["group_list_type"] == 1
    _, built, call = _build(_row("GroupedMatmulSwigluQuant"))
    assert int(built[4].sum()) == 64


def test_fused_infer_attention_inference_is_recorded():
    _, built, call = _build(_row("FusedInferAttentionScore", 0))
    kwargs = call.kwargs
    assert (kwargs["input_layout"], kwargs["num_heads"], kwargs["num_key_value_heads"]) == ("TND", 8, 1)
    assert kwargs["actual_seq_lengths"] == [1, 2, 3, 4]            # 4 tokens over a batch of 4
    assert kwargs["block_table"].shape == (4, 8) and int(kwargs["block_table"].max()) < 16
    assert kwargs["actual_seq_lengths_kv"] == [4 * 128] * 4        # 16 blocks shared by 4 sequences
    _, _, call = _build(_row("FusedInferAttentionScore", 1))
    assert call.kwargs["input_layout"] == "BNSD_NBSD" and "query_rope" in call.kwargs
    assert call.kwargs["scale"] == pytest.approx((512 + 64) ** -0.5)


def test_shape_hooks_read_their_configuration_from_the_shapes():
    assert _build(_row("Transpose"))[2].args[1] == [1, 0, 2]
    assert _build(_row("PadV3"))[2].args[1] == [0, 0, 0, 3]
    assert _build(_row("Slice"))[2].args[1:] == ([0, 0], [16, 512])
    assert _build(_row("ArgMaxV2"))[2].kwargs == {"dim": 1, "keepdim": False}
    assert _build(_row("Cast"))[2].args[1] == torch.bfloat16
    assert _build(_row("AscendQuantV2"))[2].args[3] == torch.qint8


def test_a_row_the_recipe_cannot_build_fails_naming_the_row():
    row = dict(_row("MatMulV2"), **{contract.INPUT_SHAPES: "16,256;300,500"})
    with pytest.raises(OpperfError) as error:
        _build(row, line=7)
    assert error.value.row == 7 and error.value.path == str(EXAMPLE_ROWS) and "do not multiply" in str(error.value)


def test_resolving_an_npu_api_without_torch_npu_says_what_is_missing():
    _, _, call = _build(_row("Cast"))
    with pytest.raises(OpperfError, match="cannot import 'torch_npu'"):
        to_case(call)


def test_the_real_a3_profile_rows_build_or_fail_with_the_reason():
    """Every Type of the real A3 kernel_details has a definition; each distinct row builds or says why not."""
    path = REPO / "resources" / "profiles" / "A3_vllm0.18.0_torch2.9.0_cann8.5" / "kernel_details.csv"
    with open(path, newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    outcomes = {}
    for line, row in enumerate(rows, start=2):
        definition = definition_for(DEFINITIONS, row["Type"], "npu")
        assert definition is not None, row["Type"]
        key = (row["Type"], contract.strip_profiler_quotes(row[contract.INPUT_SHAPES]))
        if key in outcomes:
            continue
        ctx = BuildContext(definition, row, "cpu", path=path, line=line)
        try:
            if definition.hook:
                outcomes[key] = importlib.import_module(definition.hook).build_call(row, ctx)
            else:
                outcomes[key] = [build_argument(spec, i, ctx) for i, spec in enumerate(definition.inputs)]
        except OpperfError as error:
            assert error.path == str(path) and error.row == line
            outcomes[key] = error
    attention = outcomes[("FlashAttentionScore", "4096,2,512;4096,2,512;4096,2,512;;;;4096,4096;;;;;")]
    assert attention.args[3:] == (4, "SBH") and attention.kwargs["scale"] == pytest.approx(128 ** -0.5)
    grad = outcomes[("FlashAttentionScoreGrad", contract.strip_profiler_quotes(rows[16][contract.INPUT_SHAPES]))]
    assert grad.api == "torch_npu.npu_fusion_attention_grad" and grad.kwargs["attention_in"].shape == (4096, 2, 512)
    inconsistent = outcomes[("FlashAttentionScore", "4096,2,511;4096,2,512;4096,2,512;;;;4096,4096;;;;;")]
    assert isinstance(inconsistent, OpperfError) and "not a multiple of the 3 heads" in str(inconsistent)
    matmul = outcomes[("MatMulV2", "81920,4096;8192,512")]
    assert isinstance(matmul, OpperfError) and "do not multiply" in str(matmul)
    assert [tuple(t.shape) for t in outcomes[("Add", ";")]] == [(), ()]          # two scalars
