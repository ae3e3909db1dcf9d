"""NPU hook: attention kernels whose slots need logic (FusedInferAttentionScore, RINGMLAPrefillBF16Kernel,
FlashAttentionScore and its Grad).

FusedInferAttentionScore rows keep all of the API's tensor slots (31, most of them empty), in the
order of `torch_npu.npu_fused_infer_attention_score`; each non-empty slot is built and passed under
its keyword. What the profiler does not record is inferred from the shapes, and every inference is
written into the call description of the trace:

- layout: 3-D query → `TND`; 4-D query with a query_rope slot → `BNSD_NBSD` when the output is
  (N, B, S, D), else `BNSD`; 4-D query without rope → `BNSD`.
- heads: num_heads from the query; num_key_value_heads from the key (paged `(blocks, block_size, H)`
  keys: H / head_dim).
- scale: 1/sqrt(head_dim (+ rope dim)); sparse_mode 3 (causal, 2048x2048 mask) when a mask is
  recorded, else 0.
- sequence lengths: the batch size is the length of the actual_seq_lengths slot; TND tokens are split
  evenly over the batch; paged KV lengths give every sequence an equal share of the cache blocks (at
  most the block table's width), so the replay reads as much KV as the cache holds.
- `Runtime <name>` columns (from fill_fia_runtime_metadata-style backfills: num_heads,
  num_key_value_heads, input_layout, sparse_mode, block_size, actual_seq_lengths_values,
  actual_seq_lengths_kv_values) override the inference where present.
"""

from __future__ import annotations

import itertools
import math

import torch

from opperf import contract
from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, split_evenly
from opperf.replay.inputs import BuildContext, parse_scalar

# npu_fused_infer_attention_score's tensor arguments, in the order of the profiler's input slots.
FIA_SLOT_NAMES = (
    "query", "key", "value", "pse_shift", "atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv",
    "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2", "antiquant_scale",
    "antiquant_offset", "block_table", "query_padding_size", "kv_padding_size", "key_antiquant_scale",
    "key_antiquant_offset", "value_antiquant_scale", "value_antiquant_offset", "key_shared_prefix",
    "value_shared_prefix", "actual_shared_prefix_len", "query_rope", "key_rope", "key_rope_antiquant_scale",
)
_SLOT = {name: index for index, name in enumerate(FIA_SLOT_NAMES)}
_HOST_LIST_SLOTS = ("actual_seq_lengths", "actual_seq_lengths_kv", "actual_shared_prefix_len")
_CAUSAL_MASK = 2048
RUNTIME_PREFIX = "Runtime "


def _runtime(ctx: BuildContext, name: str):
    """A `Runtime <name>` column's value (int, word or list), or None when the row has none."""
    text = contract.strip_profiler_quotes(ctx.row.get(RUNTIME_PREFIX + name, ""))
    if not text or text.upper() == "N/A":
        return None
    if ";" in text or ("," in text and not text.startswith("[")):
        text = "[" + text.replace(";", ",") + "]"
    return parse_scalar(text, path=ctx.path, row=ctx.line, field=RUNTIME_PREFIX + name)


def _runtime_lengths(ctx: BuildContext, name: str) -> list[int] | None:
    """A `Runtime …_values` column as a list of lengths: one sequence is written `300`, several `300;512`."""
    value = _runtime(ctx, name)
    if value is None or isinstance(value, list):
        return value
    return [value]


def _causal_mask(slots: Slots, index: int) -> torch.Tensor:
    shape = slots.require(index, "atten_mask")
    rows, cols = shape[-2:]
    mask = torch.triu(torch.ones((rows, cols), dtype=torch.bool), diagonal=1).expand(shape)
    return slots.record(index, mask.to(slots.dtype(index)).contiguous().to(slots.ctx.device))


def _sequence_lengths(shape: tuple[int, ...], batch: int, layout: str) -> list[int]:
    """actual_seq_lengths(_kv) of a non-paged tensor: TND tokens split evenly (cumulative), else S per batch."""
    if layout == "TND":
        return list(itertools.accumulate(split_evenly(shape[0], batch)))
    return [shape[2]] * batch


def _fused_infer_attention(ctx: BuildContext) -> NpuCall:
    slots = Slots(ctx)
    extra = [i for i in range(len(FIA_SLOT_NAMES), slots.count) if slots.shape(i) is not None]
    if extra:
        raise ctx.error(f"input slots {extra} are beyond the {len(FIA_SLOT_NAMES)} FusedInferAttentionScore "
                        "arguments this replay knows")
    query_shape = slots.require(_SLOT["query"], "query")
    key_shape = slots.require(_SLOT["key"], "key")
    slots.require(_SLOT["value"], "value")
    rope_shape = slots.shape(_SLOT["query_rope"])
    table_shape = slots.shape(_SLOT["block_table"])
    notes = []

    head_dim = query_shape[-1]
    if len(query_shape) == 3:
        layout, num_heads = "TND", query_shape[1]
    elif len(query_shape) == 4:
        num_heads = query_shape[1]
        output = slots.output_shape(0)
        layout = "BNSD_NBSD" if rope_shape is not None and output is not None and \
            output == (query_shape[1], query_shape[0], query_shape[2], query_shape[3]) else "BNSD"
    else:
        raise ctx.error(f"query of rank {len(query_shape)} ({query_shape}); expected TND (3-D) or BNSD (4-D)")
    layout = _runtime(ctx, "input_layout") or layout

    paged = table_shape is not None
    if paged:
        if len(key_shape) == 3:            # (blocks, block_size, KV_N * D)
            blocks, block_size = key_shape[0], key_shape[1]
            kv_heads = key_shape[2] // head_dim if key_shape[2] % head_dim == 0 else 1
        elif len(key_shape) == 4:          # (blocks, KV_N, block_size, D)
            blocks, kv_heads, block_size = key_shape[0], key_shape[1], key_shape[2]
        else:
            raise ctx.error(f"paged key of rank {len(key_shape)} ({key_shape}); expected 3-D or 4-D")
    else:
        blocks, block_size = 0, 0
        kv_heads = key_shape[1] if len(key_shape) >= 3 else 1
    num_heads = _runtime(ctx, "num_heads") or num_heads
    kv_heads = _runtime(ctx, "num_key_value_heads") or kv_heads
    block_size = _runtime(ctx, "block_size") or block_size
    scale = 1.0 / math.sqrt(head_dim + (rope_shape[-1] if rope_shape is not None else 0))

    kwargs: dict = {}
    for name in FIA_SLOT_NAMES[3:]:
        index = _SLOT[name]
        if slots.shape(index) is None or name in _HOST_LIST_SLOTS or name in ("atten_mask", "block_table"):
            continue
        kwargs[name] = slots.tensor(index, name, values="positive" if "scale" in name else "normal")

    sparse_mode = 0
    if slots.shape(_SLOT["atten_mask"]) is not None:
        kwargs["atten_mask"] = _causal_mask(slots, _SLOT["atten_mask"])
        sparse_mode = 3 if slots.shape(_SLOT["atten_mask"])[-2:] == (_CAUSAL_MASK, _CAUSAL_MASK) else 0
    runtime_sparse_mode = _runtime(ctx, "sparse_mode")      # 0 is a value here, not a missing one
    sparse_mode = runtime_sparse_mode if runtime_sparse_mode is not None else sparse_mode

    batch_shape = slots.shape(_SLOT["actual_seq_lengths"]) or slots.shape(_SLOT["actual_seq_lengths_kv"]) \
        or table_shape
    batch = batch_shape[0] if batch_shape else (query_shape[0] if len(query_shape) == 4 else None)
    if slots.shape(_SLOT["actual_seq_lengths"]) is not None:
        lengths = _runtime_lengths(ctx, "actual_seq_lengths_values")
        if lengths is None:
            lengths = _sequence_lengths(query_shape, batch, layout)
        kwargs["actual_seq_lengths"] = slots.record(_SLOT["actual_seq_lengths"], list(lengths))
    kv_lengths = _runtime_lengths(ctx, "actual_seq_lengths_kv_values")
    if paged:
        width = table_shape[1]
        blocks_each = max(1, min(width, blocks // max(batch, 1)))
        if kv_lengths is None:
            kv_lengths = [blocks_each * block_size] * batch
        per_sequence = [max(1, math.ceil(length / block_size)) for length in kv_lengths]
        if max(per_sequence) > width or sum(per_sequence) > blocks:
            raise ctx.error(f"KV lengths {kv_lengths} need {per_sequence} blocks; the block table is {table_shape} "
                            f"and the cache holds {blocks}")
        table = torch.zeros(table_shape, dtype=torch.int32)
        start = 0
        for sequence, count in enumerate(per_sequence):
            table[sequence, :count] = torch.arange(start, start + count, dtype=torch.int32)
            start += count
        kwargs["block_table"] = slots.record(_SLOT["block_table"], table.to(slots.dtype(_SLOT["block_table"]))
                                             .to(ctx.device))
        notes.append(f"kv blocks per sequence {per_sequence}")
    elif kv_lengths is None and slots.shape(_SLOT["actual_seq_lengths_kv"]) is not None:
        kv_lengths = _sequence_lengths(key_shape, batch, layout)
    if kv_lengths is not None and slots.shape(_SLOT["actual_seq_lengths_kv"]) is not None:
        kwargs["actual_seq_lengths_kv"] = slots.record(_SLOT["actual_seq_lengths_kv"], list(kv_lengths))

    kwargs.update(num_heads=num_heads, num_key_value_heads=kv_heads, input_layout=layout, scale=scale,
                  sparse_mode=sparse_mode, block_size=block_size if paged else 0)
    notes.append(f"inferred layout={layout} num_heads={num_heads} num_key_value_heads={kv_heads} "
                 f"sparse_mode={sparse_mode} block_size={block_size}")
    args = (slots.tensor(0, "query"), slots.tensor(1, "key"), slots.tensor(2, "value"))
    return slots.call("torch_npu.npu_fused_infer_attention_score", args, kwargs, notes="; ".join(notes),
                      prepare=_match_scale_keyword)


def _match_scale_keyword(call: NpuCall) -> None:
    """torch_npu before 7.0 names the softmax scale `scale_value`, later versions `scale`: use the installed one."""
    import torch_npu  # noqa: F401  (registers torch.ops.npu)

    schema = torch.ops.npu.npu_fused_infer_attention_score.default._schema
    names = {argument.name for argument in schema.arguments}
    if "scale" not in names and "scale_value" in names:
        call.kwargs["scale_value"] = call.kwargs.pop("scale")


# RINGMLAPrefillBF16Kernel's slots: q_nope, q_rope, k_nope, k_rope, value, mask, ..., pre_out (13), prev_lse (14).
_RING_PRE_OUT, _RING_PREV_LSE, _RING_MASK = 13, 14, 5
_RING_MASK_SIZE = 512


def _ring_mla(ctx: BuildContext) -> NpuCall:
    """torch_npu.atb.npu_ring_mla: the first ring step (mask, no prefix state) or a later one (pre_out/prev_lse)."""
    slots = Slots(ctx)
    names = ("q_nope", "q_rope", "k_nope", "k_rope", "value")
    q_shape = slots.require(0, "q_nope")
    k_shape = slots.require(2, "k_nope")
    if len(q_shape) != 3 or len(k_shape) != 3:
        raise ctx.error(f"q_nope {q_shape} and k_nope {k_shape} must be (tokens, heads, dim)")
    tensors = {name: slots.tensor(index, name) for index, name in enumerate(names)}
    dtype = slots.dtype(0)
    has_prefix = slots.shape(_RING_PRE_OUT) is not None and slots.shape(_RING_PREV_LSE) is not None
    output_shape = slots.output_shape(0) or slots.shape(_RING_PRE_OUT) or q_shape[:2] + (slots.shape(4)[-1],)
    lse_shape = slots.output_shape(1) or slots.shape(_RING_PREV_LSE) or (q_shape[1], q_shape[0])
    mask_shape = slots.shape(_RING_MASK) or (_RING_MASK_SIZE, _RING_MASK_SIZE)
    upper = torch.triu(torch.ones(mask_shape[-2:], dtype=torch.bool), diagonal=1).expand(mask_shape)
    fill = float("-inf") if dtype == torch.float16 else 1.0
    mask = slots.record(_RING_MASK, torch.zeros(mask_shape, dtype=dtype).masked_fill(upper, fill).to(ctx.device))
    q_len, kv_len = q_shape[0], k_shape[0]
    if has_prefix:
        pre_out = slots.tensor(_RING_PRE_OUT, "pre_out")
        prev_lse = slots.tensor(_RING_PREV_LSE, "prev_lse")
        output, softmax_lse = pre_out, prev_lse
        seqlen = torch.tensor([[q_len], [kv_len]], dtype=torch.int32)
        mask_type, calc_type = "no_mask", "calc_type_default"
    else:
        pre_out = prev_lse = None
        output = ctx.tensor(output_shape, slots.output_dtype(0) if slots.output_count else dtype, "zeros")
        softmax_lse = ctx.tensor(lse_shape, torch.float32, "zeros")
        seqlen = torch.tensor([q_len], dtype=torch.int32)
        mask_type, calc_type = "mask_type_triu", "calc_type_first_ring"
    kwargs = dict(tensors, mask=mask, seqlen=seqlen, head_num=q_shape[1], kv_head_num=k_shape[1], pre_out=pre_out,
                  prev_lse=prev_lse, qk_scale=1.0 / math.sqrt(q_shape[-1] + slots.require(1, "q_rope")[-1]),
                  kernel_type="kernel_type_high_precision", mask_type=mask_type, input_layout="type_bsnd",
                  calc_type=calc_type, output=output, softmax_lse=softmax_lse)
    return slots.call("torch_npu.atb.npu_ring_mla", (), kwargs,
                      notes=f"{calc_type}, {mask_type}, seqlen={seqlen.tolist()}")


# FlashAttentionScore (training / prefill attention, torch_npu.npu_fusion_attention). The profiler lists the
# kernel's inputs query, key, value, real_shift, drop_mask, padding_mask, atten_mask, prefix,
# actual_seq_qlen, actual_seq_kvlen, ... and its outputs softmax_max, softmax_sum, softmax_out,
# attention_out; the API returns (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels).
_FA_LAYOUTS = {3: ("SBH", "BSH"), 4: ("BNSD", "BSND")}
_FA_MASK = 6


def _fa_geometry(ctx: BuildContext, query_shape: tuple[int, ...],
                 softmax_shape: tuple[int, ...]) -> tuple[str, int, int]:
    """(input_layout, head_num, head_dim) from the query and the (B, N, S, 8) softmax statistics."""
    batch, heads, seq = softmax_shape[:3]
    if len(query_shape) == 3:
        if query_shape[-1] % heads:
            raise ctx.error(f"query hidden size {query_shape[-1]} is not a multiple of the {heads} heads the "
                            f"softmax statistics {softmax_shape} show")
        if query_shape[:2] == (seq, batch):
            return "SBH", heads, query_shape[-1] // heads
        if query_shape[:2] == (batch, seq):
            return "BSH", heads, query_shape[-1] // heads
    elif len(query_shape) == 4:
        if query_shape[:3] == (batch, heads, seq):
            return "BNSD", heads, query_shape[-1]
        if query_shape[:3] == (batch, seq, heads):
            return "BSND", heads, query_shape[-1]
    raise ctx.error(f"query {query_shape} fits no layout of {_FA_LAYOUTS.get(len(query_shape), ())} with softmax "
                    f"statistics {softmax_shape} (batch, heads, seq, 8)")


def _fa_mask(slots: Slots, index: int) -> torch.Tensor | None:
    if slots.shape(index) is None:
        return None
    return _causal_mask(slots, index)


def _flash_attention(ctx: BuildContext) -> NpuCall:
    slots = Slots(ctx)
    query_shape = slots.require(0, "query")
    slots.require(1, "key")
    slots.require(2, "value")
    softmax_shape = slots.require_output(0, "softmax_max")
    layout, heads, head_dim = _fa_geometry(ctx, query_shape, softmax_shape)
    unsupported = [i for i in (3, 4, 5, 7, 8, 9) if slots.shape(i) is not None]
    if unsupported:
        raise ctx.error(f"input slots {unsupported} (pse / dropout / padding / prefix / varlen) are not replayed")
    kwargs = {"atten_mask": _fa_mask(slots, _FA_MASK), "scale": head_dim ** -0.5, "keep_prob": 1.0,
              "sparse_mode": 0}
    args = (slots.tensor(0, "query"), slots.tensor(1, "key"), slots.tensor(2, "value"), heads, layout)
    # Kernel output order: softmax_max, softmax_sum, softmax_out, attention_out.
    return slots.call("torch_npu.npu_fusion_attention", args, kwargs,
                      outputs=lambda result: (result[1], result[2], None, result[0]),
                      notes=f"layout={layout} head_num={heads} head_dim={head_dim}")


def _flash_attention_grad(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_fusion_attention_grad: optional slots placed by dtype and shape (the row lists the
    kernel's non-empty inputs: q, k, v, dy, then mask, softmax_max, softmax_sum, softmax_in, attention_in)."""
    slots = Slots(ctx)
    names = ("query", "key", "value", "dy")
    query_shape = slots.require(0, "query")
    for index, name in enumerate(names):
        slots.require(index, name)
    roles: dict[str, int] = {}
    for index in range(len(names), slots.count):
        shape = slots.shape(index)
        if shape is None:
            continue
        dtype = slots.dtype_name(index)
        if dtype == "DT_BOOL" or (dtype == "DT_UINT8" and len(shape) >= 2 and shape[-1] == shape[-2]):
            role = "atten_mask"
        elif dtype == "DT_FLOAT" and len(shape) == 4 and shape[-1] == 8:
            role = "softmax_max" if "softmax_max" not in roles else "softmax_sum"
        elif shape == query_shape:
            role = "attention_in"
        else:
            raise ctx.error(f"input slot {index} ({shape}, {dtype}) is none of atten_mask, softmax_max/sum "
                            "(B, N, S, 8) FLOAT, attention_in")
        if role in roles:
            raise ctx.error(f"input slot {index} would be a second {role}")
        roles[role] = index
    if "softmax_max" not in roles or "softmax_sum" not in roles or "attention_in" not in roles:
        raise ctx.error(f"needs softmax_max, softmax_sum and attention_in slots, found {sorted(roles)}")
    layout, heads, head_dim = _fa_geometry(ctx, query_shape, slots.shape(roles["softmax_max"]))
    kwargs = {"atten_mask": _causal_mask(slots, roles["atten_mask"]) if "atten_mask" in roles else None,
              "softmax_max": slots.tensor(roles["softmax_max"], "softmax_max", values="positive"),
              "softmax_sum": slots.tensor(roles["softmax_sum"], "softmax_sum", values="positive"),
              "attention_in": slots.tensor(roles["attention_in"], "attention_in"),
              "scale_value": head_dim ** -0.5, "keep_prob": 1.0, "sparse_mode": 0}
    args = tuple(slots.tensor(i, name) for i, name in enumerate(names)) + (heads, layout)
    return slots.call("torch_npu.npu_fusion_attention_grad", args, kwargs,
                      notes=f"layout={layout} head_num={heads} head_dim={head_dim}")


_BUILDERS = {
    "FusedInferAttentionScore": _fused_infer_attention,
    "RINGMLAPrefillBF16Kernel": _ring_mla,
    "FlashAttentionScore": _flash_attention,
    "FlashAttentionScoreGrad": _flash_attention_grad,
}

build_call, build_case = hook_entry_points(_BUILDERS)
