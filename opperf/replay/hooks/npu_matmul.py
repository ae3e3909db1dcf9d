"""NPU hook: matrix multiplies and quantisation (MatMulV2/V3/Common, BatchMatMulV2, QuantBatchMatmulV3, AscendQuantV2).

The profiler records the shapes of the tensors the kernel received. A linear layer's weight is
stored (N, K) and multiplied transposed, so slot 1 of a MatMul row is either (K, N) or (N, K): the
builder reads which one from the output shape (M, N) and, for (N, K), builds the weight as stored and
passes its transposed view, exactly what `F.linear` hands the kernel. The same holds for slot 0 and
for batched shapes. FRACTAL_NZ slots are built as their ND matrix and cast on the NPU.
"""

from __future__ import annotations

import torch

from opperf import contract
from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, numel
from opperf.replay.inputs import BuildContext


def _operand(slots: Slots, index: int, name: str, rows: int, cols: int) -> torch.Tensor:
    """Slot `index` as a (…, rows, cols) operand: built as recorded, transposed if stored (…, cols, rows)."""
    shape = slots.require(index, name)
    first, second = shape[-2:]
    if (first, second) == (rows, cols):
        return slots.tensor(index, name)
    if (first, second) == (cols, rows):
        return slots.tensor(index, name).transpose(-2, -1)
    raise slots.ctx.error(f"input slot {index} ({name}) has shape {shape}; the output needs "
                          f"(..., {rows}, {cols}) or its stored transpose (..., {cols}, {rows})")


def _contraction(slots: Slots, a_shape: tuple[int, ...], b_shape: tuple[int, ...], m: int, n: int) -> int:
    """K: the dimension slot 0 and slot 1 share once M and N are placed."""
    a_candidates = [d for d, other in ((a_shape[-1], a_shape[-2]), (a_shape[-2], a_shape[-1])) if other == m]
    b_candidates = [d for d, other in ((b_shape[-2], b_shape[-1]), (b_shape[-1], b_shape[-2])) if other == n]
    for k in a_candidates:
        if k in b_candidates:
            return k
    raise slots.ctx.error(f"inputs {a_shape} and {b_shape} do not multiply to an output (..., {m}, {n}) in any "
                          "stored/transposed layout")


def _matmul(ctx: BuildContext) -> NpuCall:
    slots = Slots(ctx)
    a_shape, b_shape = slots.require(0, "x"), slots.require(1, "weight")
    out = slots.require_output(0, "y")
    if len(a_shape) != 2 or len(b_shape) != 2 or len(out) != 2:
        raise ctx.error(f"MatMul replays as torch.mm on 2-D operands; got {a_shape}, {b_shape} -> {out}")
    m, n = out
    k = _contraction(slots, a_shape, b_shape, m, n)
    a = _operand(slots, 0, "x", m, k)
    b = _operand(slots, 1, "weight", k, n)
    bias = slots.optional(2, "bias")
    if slots.count > 3:
        raise ctx.error(f"MatMul rows have 2 or 3 input slots (x, weight[, bias]), this one has {slots.count}")
    if bias is not None:
        return slots.call("torch.addmm", (bias, a, b))
    return slots.call("torch.mm", (a, b))


def _batch_matmul(ctx: BuildContext) -> NpuCall:
    slots = Slots(ctx)
    a_shape, b_shape = slots.require(0, "x1"), slots.require(1, "x2")
    out = slots.require_output(0, "y")
    if min(len(a_shape), len(b_shape), len(out)) < 2:
        raise ctx.error(f"BatchMatMul needs operands of rank >= 2, got {a_shape}, {b_shape} -> {out}")
    m, n = out[-2:]
    k = _contraction(slots, a_shape, b_shape, m, n)
    a = _operand(slots, 0, "x1", m, k)
    b = _operand(slots, 1, "x2", k, n)
    if slots.shape(2) is not None:
        raise ctx.error("BatchMatMulV2 with a bias slot is not replayed (torch.matmul has no bias)")
    return slots.call("torch.matmul", (a, b))


def _quant_batch_matmul(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_quant_matmul(x1, x2, scale, offset=, pertoken_scale=, bias=, output_dtype=).

    Slots 3.. are optional and the profiler does not name them: INT32 (or a 1-D BF16/FP16 vector of
    length N) is the bias, a FLOAT vector of length M the per-token scale, a FLOAT of length 1 or N
    the offset.
    """
    slots = Slots(ctx)
    x1_shape = slots.require(0, "x1")
    slots.require(1, "x2")
    slots.require(2, "scale")
    out = slots.require_output(0, "y")
    m, n = (x1_shape[-2] if len(x1_shape) >= 2 else 1), out[-1]
    kwargs = {"output_dtype": slots.output_dtype(0)}
    args = (slots.tensor(0, "x1"), slots.tensor(1, "x2"), slots.tensor(2, "scale", values="positive"))
    for index in range(3, slots.count):
        shape = slots.shape(index)
        if shape is None:
            continue
        dtype, count = slots.dtype_name(index), numel(shape)
        if dtype == "DT_INT32" or (dtype in ("DT_BF16", "DT_FLOAT16") and count == n):
            role = "bias"
        elif dtype == "DT_FLOAT" and count == m and "pertoken_scale" not in kwargs:
            role = "pertoken_scale"
        elif dtype == "DT_FLOAT" and count in (1, n) and "offset" not in kwargs:
            role = "offset"
        else:
            raise ctx.error(f"input slot {index} ({shape}, {dtype}) is none of bias (INT32 or BF16/FP16 of N), "
                            f"pertoken_scale (FLOAT of M={m}) or offset (FLOAT of 1 or N={n})")
        if role in kwargs:
            raise ctx.error(f"input slot {index} would be a second {role}")
        kwargs[role] = slots.tensor(index, role, values="positive" if role != "bias" else "normal")
    return slots.call("torch_npu.npu_quant_matmul", args, kwargs)


_QUANTIZED_DTYPES = {"DT_INT8": "qint8", "DT_UINT8": "quint8", "DT_INT32": "qint32", "DT_INT4": "quint4x2"}


def _ascend_quant(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_quantize(x, scales, zero_points, dtype, axis=-1, div_mode=False); dtype from the output."""
    slots = Slots(ctx)
    names = ctx.slots.output_dtypes
    output = names[0].strip() if names else ""
    canonical = contract.canonical_dtype(output) if contract.is_known_dtype(output) else output
    if canonical not in _QUANTIZED_DTYPES:
        raise ctx.error(f"output data type {output!r} is not a quantised type ({sorted(_QUANTIZED_DTYPES)})",
                        contract.OUTPUT_DTYPES)
    quant_dtype = getattr(torch, _QUANTIZED_DTYPES[canonical])
    x = slots.tensor(0, "x")
    scales = slots.tensor(1, "scales", values="positive")
    zero_points = slots.optional(2, "zero_points")
    return slots.call("torch_npu.npu_quantize", (x, scales, zero_points, quant_dtype, -1, False))


_BUILDERS = {
    "MatMulV2": _matmul,
    "BatchMatMulV2": _batch_matmul,
    "QuantBatchMatmulV3": _quant_batch_matmul,
    "AscendQuantV2": _ascend_quant,
}

build_call, build_case = hook_entry_points(_BUILDERS)
