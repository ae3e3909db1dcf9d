"""NPU hook: vLLM-Ascend deployment kernels whose arguments live in the shapes (reductions, concat/stack,
gather/scatter by dimension, fills, format casts, fused norm-quant, RoPE, MoE gating, sampling, sparse attention).

Each builder reads what the profiler does not record as a value (a reduced dimension, a repeat count, a top-k)
back from the input and output shapes, and says what it inferred in the call's notes. Empty slots are optional
arguments that were absent: they are passed as None (never as a 0-d tensor).
"""

from __future__ import annotations

import math

import torch

from opperf.replay.hooks.npu_common import NpuCall, Slots, hook_entry_points, numel, split_evenly
from opperf.replay.inputs import BuildContext


def _dims_removed(ctx: BuildContext, shape: tuple[int, ...], out: tuple[int, ...]) -> tuple[list[int], bool]:
    """The dimensions a reduction removed (keepdim when they stay as 1s)."""
    if len(out) == len(shape):
        dims = [d for d in range(len(shape)) if out[d] != shape[d]]
        if all(out[d] == 1 for d in dims):
            return dims or [len(shape) - 1], True
    else:
        kept, dims = list(out), []
        for d, size in enumerate(shape):
            if kept and kept[0] == size:
                kept.pop(0)
            else:
                dims.append(d)
        if not kept:
            return dims, False
    raise ctx.error(f"output {out} is not input {shape} reduced along some dimensions")


def _cumsum(ctx: BuildContext) -> NpuCall:
    """torch.cumsum(x, dim): the last dimension (the serving stack's use: token counts, probabilities)."""
    slots = Slots(ctx)
    slots.require(0, "x")
    return slots.call("torch.cumsum", (slots.tensor(0, "x"),), {"dim": -1, "dtype": slots.output_dtype(0)},
                      notes="dim=-1, dtype of the output")


def _reduce_sum(ctx: BuildContext) -> NpuCall:
    """torch.sum(x, dims, keepdim): the dimensions missing from the output."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.output_shape(0) or ()
    dims, keepdim = _dims_removed(ctx, shape, tuple(out))
    return slots.call("torch.sum", (slots.tensor(0, "x"), dims), {"keepdim": keepdim}, notes=f"dim={dims}")


def _join_dim(ctx: BuildContext, shapes: list[tuple[int, ...]], out: tuple[int, ...], stack: bool) -> int:
    """The dimension cat/stack joined along, from the inputs' and the output's shapes."""
    for dim in range(len(out)):
        if stack:
            if out[dim] == len(shapes) and all(out[:dim] + out[dim + 1:] == s for s in shapes):
                return dim
        elif all(len(s) == len(out) and s[:dim] + s[dim + 1:] == out[:dim] + out[dim + 1:] for s in shapes) \
                and sum(s[dim] for s in shapes) == out[dim]:
            return dim
    raise ctx.error(f"inputs {shapes} do not {'stack' if stack else 'concatenate'} into output {out}")


def _concat(ctx: BuildContext, stack: bool) -> NpuCall:
    slots = Slots(ctx)
    indices = [i for i in range(slots.count) if slots.shape(i) is not None]
    if not indices:
        raise ctx.error("no input tensors")
    shapes = [slots.shape(i) for i in indices]
    dim = _join_dim(ctx, shapes, tuple(slots.require_output(0, "y")), stack)
    tensors = [slots.tensor(i, f"x{i}") for i in indices]
    return slots.call("torch.stack" if stack else "torch.cat", (tensors,), {"dim": dim},
                      notes=f"{len(tensors)} tensors, dim={dim}")


def _tile(ctx: BuildContext) -> NpuCall:
    """x.repeat(multiples): multiples = output / input per dimension."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.require_output(0, "y")
    shape = (1,) * (len(out) - len(shape)) + tuple(shape)
    if len(shape) != len(out) or any(o % s for o, s in zip(out, shape)):
        raise ctx.error(f"output {out} is not input {shape} tiled")
    multiples = [o // s for o, s in zip(out, shape)]
    return slots.call("torch.Tensor.repeat", (slots.tensor(0, "x"), multiples), notes=f"multiples={multiples}")


def _broadcast_to(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_broadcast(x, size): size is the output shape (the shape slot is the kernel's metadata)."""
    slots = Slots(ctx)
    slots.require(0, "x")
    out = list(slots.require_output(0, "y"))
    return slots.call("torch_npu.npu_broadcast", (slots.tensor(0, "x"), out), notes=f"size={out}")


def _fill(ctx: BuildContext) -> NpuCall:
    """torch.full(size, value): the output's shape and dtype (Fill's inputs are its dims and value)."""
    slots = Slots(ctx)
    out = list(slots.require_output(0, "y"))
    return slots.call("torch.full", (out, 1.0), {"dtype": slots.output_dtype(0), "device": ctx.device},
                      notes=f"size={out}")


def _range(ctx: BuildContext) -> NpuCall:
    """torch.arange(n): n the output's length, in the output's dtype."""
    slots = Slots(ctx)
    out = slots.require_output(0, "y")
    if len(out) != 1:
        raise ctx.error(f"Range outputs a vector; the row's output is {out}")
    return slots.call("torch.arange", (out[0],), {"dtype": slots.output_dtype(0), "device": ctx.device},
                      notes=f"end={out[0]}")


def _axis_of(ctx: BuildContext, shape: tuple[int, ...], index_shape: tuple[int, ...]) -> int:
    """The dimension a gather/scatter by index runs along: the one where the index's extent differs (else last)."""
    if len(index_shape) != len(shape):
        raise ctx.error(f"index {index_shape} and input {shape} must have the same rank")
    differing = [d for d in range(len(shape)) if index_shape[d] != shape[d]]
    return differing[0] if len(differing) == 1 else len(shape) - 1


def _gather_elements(ctx: BuildContext) -> NpuCall:
    """torch.gather(x, dim, index): valid indices along the dimension the index shape reveals."""
    slots = Slots(ctx)
    shape, index_shape = slots.require(0, "x"), slots.require(1, "index")
    dim = _axis_of(ctx, shape, index_shape)
    return slots.call("torch.gather", (slots.tensor(0, "x"), dim, slots.index(1, "index", shape[dim])),
                      notes=f"dim={dim}")


def _scatter_elements(ctx: BuildContext) -> NpuCall:
    """torch.scatter(x, dim, index, src): valid indices along the dimension the index shape reveals."""
    slots = Slots(ctx)
    shape, index_shape = slots.require(0, "x"), slots.require(1, "index")
    slots.require(2, "src")
    dim = _axis_of(ctx, shape, index_shape)
    return slots.call("torch.scatter", (slots.tensor(0, "x"), dim, slots.index(1, "index", shape[dim]),
                                        slots.tensor(2, "src")), notes=f"dim={dim}")


def _index_fill(ctx: BuildContext) -> NpuCall:
    """torch.index_fill(x, dim, index, value): dim 0 when the index fits it, else the last dimension."""
    slots = Slots(ctx)
    shape, index_shape = slots.require(0, "x"), slots.require(1, "index")
    if len(index_shape) != 1:
        raise ctx.error(f"index_fill takes a 1-D index, the row's is {index_shape}")
    dim = 0 if index_shape[0] <= shape[0] else len(shape) - 1
    return slots.call("torch.index_fill", (slots.tensor(0, "x"), dim, slots.index(1, "index", shape[dim]), 0.0),
                      notes=f"dim={dim}")


def _index_put(ctx: BuildContext) -> NpuCall:
    """torch.index_put(x, (indices...), values): slots x, values, then one index per leading dimension."""
    slots = Slots(ctx)
    shape = slots.require(0, "x")
    slots.require(1, "values")
    index_slots = [i for i in range(2, slots.count) if slots.shape(i) is not None]
    if not index_slots or len(index_slots) > len(shape):
        raise ctx.error(f"found {len(index_slots)} index tensors for an input of rank {len(shape)}")
    indices = []
    for dim, slot in enumerate(index_slots):
        if slots.dtype(slot) == torch.bool:
            indices.append(slots.tensor(slot, f"mask_{dim}"))
        else:
            indices.append(slots.index(slot, f"index_{dim}", shape[dim], unique=True))
    return slots.call("torch.index_put", (slots.tensor(0, "x"), indices, slots.tensor(1, "values")))


def _repeat_interleave(ctx: BuildContext) -> NpuCall:
    """torch.repeat_interleave(x, repeats, dim): repeats = output / input along the one dimension that grew."""
    slots = Slots(ctx)
    shape, out = slots.require(0, "x"), slots.require_output(0, "y")
    grown = [d for d in range(len(shape)) if len(out) == len(shape) and out[d] != shape[d]]
    if len(shape) == len(out) and len(grown) == 1 and out[grown[0]] % shape[grown[0]] == 0:
        dim, repeats = grown[0], out[grown[0]] // shape[grown[0]]
        return slots.call("torch.repeat_interleave", (slots.tensor(0, "x"), repeats), {"dim": dim},
                          notes=f"repeats={repeats}, dim={dim}")
    if len(out) == 1 and out[0] % numel(shape) == 0:
        repeats = out[0] // numel(shape)
        return slots.call("torch.repeat_interleave", (slots.tensor(0, "x"), repeats), notes=f"repeats={repeats}")
    raise ctx.error(f"output {out} is not input {shape} repeated along one dimension")


def _histogram(ctx: BuildContext) -> NpuCall:
    """torch.histc(x, bins): bins = the output's length."""
    slots = Slots(ctx)
    slots.require(0, "x")
    bins = numel(slots.require_output(0, "y"))
    return slots.call("torch.histc", (slots.tensor(0, "x", values="uniform"),), {"bins": bins, "min": 0, "max": 1},
                      notes=f"bins={bins}")


# ACL storage format ids (torch_npu.npu_format_cast's acl_format).
ACL_FORMATS = {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "NDC1HWC0": 32, "FRACTAL_NZ": 29}


def _trans_data(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_format_cast(x, acl_format): the output's storage format (ND <-> FRACTAL_NZ, ...)."""
    slots = Slots(ctx)
    slots.require(0, "x")
    formats = ctx.slots.output_formats
    target = formats[0] if formats else ""
    if target not in ACL_FORMATS:
        raise ctx.error(f"output format {target!r} is not one of {sorted(ACL_FORMATS)}", "Output Formats")
    return slots.call("torch_npu.npu_format_cast", (slots.tensor(0, "x"), ACL_FORMATS[target]),
                      notes=f"acl_format={ACL_FORMATS[target]} ({target})")


def _add_rms_norm_dynamic_quant(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, smooth_scale1=, smooth_scale2=, beta=)."""
    slots = Slots(ctx)
    for index, name in enumerate(("x1", "x2", "gamma")):
        slots.require(index, name)
    kwargs = {name: slots.optional(3 + i, name, values="positive")
              for i, name in enumerate(("smooth_scale1", "smooth_scale2", "beta"))}
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    mask = [True, slots.output_count >= 4 and slots.output_shape(3) is not None]
    kwargs.update(epsilon=1e-6, output_mask=mask)
    return slots.call("torch_npu.npu_add_rms_norm_dynamic_quant",
                      tuple(slots.tensor(i, n) for i, n in enumerate(("x1", "x2", "gamma"))), kwargs)


def _apply_rotary_pos_emb(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_apply_rotary_pos_emb(q, k, cos, sin, layout): BSND for 4-D rows, BSH for 3-D."""
    slots = Slots(ctx)
    shapes = [slots.require(i, n) for i, n in enumerate(("query", "key", "cos", "sin"))]
    layout = {4: "BSND", 3: "BSH"}.get(len(shapes[0]))
    if layout is None:
        raise ctx.error(f"query of rank {len(shapes[0])}; 3-D (BSH) or 4-D (BSND) expected")
    return slots.call("torch_npu.npu_apply_rotary_pos_emb",
                      tuple(slots.tensor(i, n) for i, n in enumerate(("query", "key", "cos", "sin"))),
                      {"layout": layout}, notes=f"layout={layout}")


def _attention_update(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_attention_update(lse list, local_out list, update_type=0): slots are the lse tensors (1-D,
    FLOAT) then as many local outputs (2-D) - one pair per context-parallel rank."""
    slots = Slots(ctx)
    filled = [i for i in range(slots.count) if slots.shape(i) is not None]
    lse = [i for i in filled if len(slots.shape(i)) == 1]
    outs = [i for i in filled if len(slots.shape(i)) == 2]
    if not lse or len(lse) != len(outs) or len(lse) + len(outs) != len(filled):
        raise ctx.error(f"expected n 1-D lse slots and n 2-D output slots, got shapes "
                        f"{[slots.shape(i) for i in filled]}")
    return slots.call("torch_npu.npu_attention_update", ([slots.tensor(i, "lse") for i in lse],
                                                          [slots.tensor(i, "local_out") for i in outs], 0),
                      notes=f"{len(lse)} ranks")


def _moe_gating_top_k(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_moe_gating_top_k(x, k, bias=): k from the output (tokens, k); grouped routing off."""
    slots = Slots(ctx)
    slots.require(0, "x")
    k = slots.require_output(0, "y")[-1]
    kwargs = {"k_group": 1, "group_count": 1}
    if slots.shape(1) is not None:
        kwargs["bias"] = slots.tensor(1, "bias")
    return slots.call("torch_npu.npu_moe_gating_top_k", (slots.tensor(0, "x"), k), kwargs, notes=f"k={k}")


def _layer_norm(ctx: BuildContext) -> NpuCall:
    """torch.native_layer_norm(x, normalized_shape, weight, bias, eps) -> (y, mean, rstd): over gamma's shape."""
    slots = Slots(ctx)
    slots.require(0, "x")
    gamma = slots.shape(1)
    normalized = list(gamma) if gamma is not None else [slots.require(0, "x")[-1]]
    return slots.call("torch.native_layer_norm",
                      (slots.tensor(0, "x"), normalized, slots.optional(1, "weight"), slots.optional(2, "bias"), 1e-5),
                      notes=f"normalized_shape={normalized}")


def _top_k_top_p(api: str, imports: tuple[str, ...]):
    def build(ctx: BuildContext) -> NpuCall:
        """logits, p (probabilities in (0, 1]), k (1..8): top-k then top-p filtering of the logits."""
        slots = Slots(ctx)
        slots.require(0, "logits")
        kwargs = {}
        if slots.shape(1) is not None:
            kwargs["p"] = slots.tensor(1, "p", values="uniform")
        if slots.shape(2) is not None:
            kwargs["k"] = slots.tensor(2, "k", values="positive")
        return slots.call(api, (slots.tensor(0, "logits"),), kwargs, import_modules=imports)
    return build


def _lightning_indexer(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_lightning_indexer(query, key, weights, actual_seq_lengths_query=, actual_seq_lengths_key=,
    block_table=, layout_query=, layout_key=, sparse_count=): TND query, paged (PA_BSND) key when a block table
    is recorded; sparse_count is the output's last dimension."""
    slots = Slots(ctx)
    query, key = slots.require(0, "query"), slots.require(1, "key")
    slots.require(2, "weights")
    sparse_count = slots.require_output(0, "sparse_indices")[-1]
    layout_query = "TND" if len(query) == 3 else "BSND"
    paged = slots.shape(5) is not None
    kwargs = {"layout_query": layout_query, "layout_key": "PA_BSND" if paged else layout_query,
              "sparse_count": sparse_count, "sparse_mode": 3}
    batch = next((slots.shape(i)[0] for i in (3, 4, 5) if slots.shape(i) is not None), 1)
    if slots.shape(3) is not None:
        kwargs["actual_seq_lengths_query"] = slots.tensor(3, "actual_seq_lengths_query", values="positive")
    if slots.shape(4) is not None:
        kwargs["actual_seq_lengths_key"] = slots.tensor(4, "actual_seq_lengths_key", values="positive")
    if paged:
        kwargs["block_table"] = slots.index(5, "block_table", key[0])
    return slots.call("torch_npu.npu_lightning_indexer", tuple(slots.tensor(i, n) for i, n in
                                                             enumerate(("query", "key", "weights"))), kwargs,
                      notes=f"layout_query={layout_query}, paged={paged}, batch={batch}, sparse_count={sparse_count}")


def _sparse_flash_attention(ctx: BuildContext) -> NpuCall:
    """torch_npu.npu_sparse_flash_attention(query, key, value, sparse_indices, scale_value, block_table=,
    actual_seq_lengths_query=, actual_seq_lengths_kv=, query_rope=, key_rope=, layout_query=, layout_kv=).
    Slots in that order; scale 1/sqrt(query dim + rope dim)."""
    slots = Slots(ctx)
    query = slots.require(0, "query")
    key = slots.require(1, "key")
    slots.require(2, "value")
    indices_shape = slots.require(3, "sparse_indices")
    paged = slots.shape(4) is not None
    rope = slots.shape(7)
    scale = 1.0 / math.sqrt(query[-1] + (rope[-1] if rope is not None else 0))
    kwargs = {"layout_query": "TND" if len(query) == 3 else "BSND", "layout_kv": "PA_BSND" if paged else "BSND",
              "sparse_mode": 3}
    if paged:
        kwargs["block_table"] = slots.index(4, "block_table", key[0])
    for index, name in ((5, "actual_seq_lengths_query"), (6, "actual_seq_lengths_kv")):
        if slots.shape(index) is not None:
            kwargs[name] = slots.tensor(index, name, values="positive")
    for index, name in ((7, "query_rope"), (8, "key_rope")):
        if slots.shape(index) is not None:
            kwargs[name] = slots.tensor(index, name)
    kv_tokens = key[0] * key[1] if paged else key[-3] if len(key) >= 3 else key[0]
    sparse_indices = slots.index(3, "sparse_indices", max(1, kv_tokens))
    args = (slots.tensor(0, "query"), slots.tensor(1, "key"), slots.tensor(2, "value"), sparse_indices, scale)
    return slots.call("torch_npu.npu_sparse_flash_attention", args, kwargs,
                      notes=f"layout={kwargs['layout_query']}/{kwargs['layout_kv']}, {indices_shape[-1]} selected "
                            f"tokens, scale={scale:.6g}")


def _init_triton(call: NpuCall) -> None:
    from vllm_ascend.ops.triton.triton_utils import init_device_properties_triton
    init_device_properties_triton()


VLLM_OPS = ("torch_npu", "vllm_ascend.ops.register_custom_ops")


def _muls_add(ctx: BuildContext) -> NpuCall:
    """torch.ops.vllm.muls_add(x, y, scale) -> x * scale + y (vLLM-Ascend's Triton muls_add_kernel).

    The launch's first two tensors are x and y (equal shapes); a third (the output buffer) is not an argument.
    """
    slots = Slots(ctx)
    x, y = slots.require(0, "x"), slots.require(1, "y")
    if x != y:
        raise ctx.error(f"muls_add adds equal shapes; x is {x}, y is {y}")
    return slots.call("torch.ops.vllm.muls_add", (slots.tensor(0, "x"), slots.tensor(1, "y"), 1.0),
                      import_modules=VLLM_OPS, prepare=_init_triton)


def _triton_rope(ctx: BuildContext) -> NpuCall:
    """torch.ops.vllm.npu_rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim, True):
    vLLM-Ascend's rope_forward_oot, which launches the Triton _triton_rope kernel.

    Slots are placed by rank and dtype, whatever their order: the 1-D integer vector is positions, the 3-D
    floating tensors are query and key (tokens, heads, head_size; query first), the 2-D floating one is the
    cos/sin cache (max positions, rotary_dim).
    """
    slots = Slots(ctx)
    filled = [i for i in range(slots.count) if slots.shape(i) is not None]
    positions = [i for i in filled if len(slots.shape(i)) == 1 and not slots.dtype(i).is_floating_point]
    heads = [i for i in filled if len(slots.shape(i)) == 3 and slots.dtype(i).is_floating_point]
    caches = [i for i in filled if len(slots.shape(i)) == 2 and slots.dtype(i).is_floating_point]
    if len(positions) != 1 or len(heads) < 2 or len(caches) != 1:
        raise ctx.error(f"expected positions (1-D int), query and key (3-D) and a cos/sin cache (2-D); got "
                        f"{[slots.shape(i) for i in filled]}")
    query, key, cache = heads[0], heads[1], caches[0]
    head_size, rotary_dim = slots.shape(query)[-1], slots.shape(cache)[-1]
    args = (slots.index(positions[0], "positions", slots.shape(cache)[0]), slots.tensor(query, "query"),
            slots.tensor(key, "key"), slots.tensor(cache, "cos_sin_cache"), head_size, rotary_dim, True)
    return slots.call("torch.ops.vllm.npu_rotary_embedding", args, import_modules=VLLM_OPS, prepare=_init_triton,
                      notes=f"head_size={head_size}, rotary_dim={rotary_dim}, neox style")


def _batch_matmul_transpose(ctx: BuildContext) -> NpuCall:
    """torch.ops._C_ascend.batch_matmul_transpose(a (T, N, L), b (N, L, V), c (T, N, V)): MLA's V up-projection,
    written into c (the third slot, else a buffer of the output's shape)."""
    slots = Slots(ctx)
    a, b = slots.require(0, "tensor_a"), slots.require(1, "tensor_b")
    if len(a) != 3 or len(b) != 3 or a[1] != b[0] or a[2] != b[1]:
        raise ctx.error(f"expected a (T, N, L) and b (N, L, V); got {a} and {b}")
    out_shape = (a[0], a[1], b[2])
    c = slots.tensor(2, "tensor_c") if slots.shape(2) is not None else ctx.tensor(out_shape, slots.dtype(0), "zeros")
    return slots.call("torch.ops._C_ascend.batch_matmul_transpose", (slots.tensor(0, "tensor_a"),
                                                                     slots.tensor(1, "tensor_b"), c),
                      import_modules=("torch_npu", "vllm_ascend.vllm_ascend_C"), outputs=lambda _: c)


def _paged_cache_load(ctx: BuildContext) -> NpuCall:
    """torch_npu.atb.npu_paged_cache_load(key_cache, value_cache, block_table, context_lens, seq_starts=,
    key=, value=): gathers each sequence's KV out of the paged cache into (tokens, heads, dim) buffers.

    The row holds no lengths: the output's tokens are split evenly over the block table's sequences (each
    at most the table's width x block_size), and each sequence's blocks are distinct valid block ids.
    """
    slots = Slots(ctx)
    cache = slots.require(0, "key_cache")
    slots.require(1, "value_cache")
    table = slots.require(2, "block_table")
    slots.require(3, "context_lens")
    key_out, value_out = slots.require_output(0, "key"), slots.require_output(1, "value")
    if len(cache) != 4 or len(table) != 2:
        raise ctx.error(f"expected a paged cache (blocks, block_size, heads, dim) and a 2-D block table; got "
                        f"{cache} and {table}")
    blocks, block_size = cache[0], cache[1]
    sequences, width = table
    tokens = key_out[0]
    try:
        lengths = split_evenly(tokens, sequences, minimum=0)
    except ValueError as exc:
        raise ctx.error(str(exc)) from exc
    needed = [math.ceil(n / block_size) for n in lengths]
    if max(needed, default=0) > width or sum(needed) > blocks:
        raise ctx.error(f"{tokens} tokens over {sequences} sequences need {needed} blocks; the table is {table} "
                        f"and the cache holds {blocks}")
    block_table = torch.zeros(table, dtype=slots.dtype(2))
    start = 0
    for row, count in enumerate(needed):
        block_table[row, :count] = torch.arange(start, start + count)
        start += count
    kwargs = {"key": ctx.tensor(key_out, slots.output_dtype(0), "zeros"),
              "value": ctx.tensor(value_out, slots.output_dtype(1), "zeros")}
    if slots.shape(4) is not None:
        kwargs["seq_starts"] = slots.record(4, torch.zeros(slots.shape(4), dtype=slots.dtype(4)).to(ctx.device))
    args = (slots.tensor(0, "key_cache"), slots.tensor(1, "value_cache"),
            slots.record(2, block_table.to(ctx.device)),
            slots.record(3, torch.tensor(lengths, dtype=slots.dtype(3)).to(ctx.device)))
    return slots.call("torch_npu.atb.npu_paged_cache_load", args, kwargs,
                      outputs=lambda _: (kwargs["key"], kwargs["value"]),
                      notes=f"context lengths {lengths} (tokens split evenly over {sequences} sequences)")


def _atb_rope(ctx: BuildContext) -> NpuCall:
    """torch_npu._npu_rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox_style): ATB's
    in-place RoPE on (tokens, heads x head_size) query/key; head_size = the cos/sin cache's width (full rotary).

    Slots are placed by rank and dtype: the 1-D integer vector is positions, the 2-D floating tensors are
    query, key (first two) and the cos/sin cache (the one whose rows are not the tokens).
    """
    slots = Slots(ctx)
    filled = [i for i in range(slots.count) if slots.shape(i) is not None]
    positions = [i for i in filled if len(slots.shape(i)) == 1 and not slots.dtype(i).is_floating_point]
    two_d = [i for i in filled if len(slots.shape(i)) == 2 and slots.dtype(i).is_floating_point]
    if len(positions) != 1 or len(two_d) != 3:
        raise ctx.error(f"expected positions (1-D int), query, key and a cos/sin cache (2-D); got "
                        f"{[slots.shape(i) for i in filled]}")
    tokens = slots.shape(positions[0])[0]
    caches = [i for i in two_d if slots.shape(i)[0] != tokens] or [two_d[-1]]
    cache = caches[-1]
    query, key = [i for i in two_d if i != cache][:2]
    head_size = slots.shape(cache)[-1]
    q, k = slots.tensor(query, "query"), slots.tensor(key, "key")
    args = (slots.index(positions[0], "positions", slots.shape(cache)[0]), q, k, head_size,
            slots.tensor(cache, "cos_sin_cache"), True)
    return slots.call("torch_npu._npu_rotary_embedding", args, outputs=lambda _: (q, k),
                      notes=f"head_size={head_size}, neox style, in place on query and key")


_BUILDERS = {
    "PagedCacheLoadNdKernel": _paged_cache_load,
    "AtbRopeKernel": _atb_rope,
    "muls_add_kernel": _muls_add,
    "_triton_rope": _triton_rope,
    "batch_matmul_transpose_0": _batch_matmul_transpose,
    "Cumsum": _cumsum,
    "ReduceSum": _reduce_sum,
    "ConcatD": lambda ctx: _concat(ctx, stack=False),
    "Pack": lambda ctx: _concat(ctx, stack=True),
    "Tile": _tile,
    "BroadcastTo": _broadcast_to,
    "Fill": _fill,
    "Range": _range,
    "GatherElementsV2": _gather_elements,
    "ScatterElementsV2": _scatter_elements,
    "IndexFill": _index_fill,
    "IndexPutV2": _index_put,
    "RepeatInterleave": _repeat_interleave,
    "HistogramV2": _histogram,
    "TransData": _trans_data,
    "AddRmsNormDynamicQuant": _add_rms_norm_dynamic_quant,
    "ApplyRotaryPosEmb": _apply_rotary_pos_emb,
    "AttentionUpdate": _attention_update,
    "MoeGatingTopK": _moe_gating_top_k,
    "LayerNormV3": _layer_norm,
    "ApplyTopKTopPWithSorted": _top_k_top_p("torch_npu.npu_top_k_top_p", ("torch_npu",)),
    "ApplyTopKTopPCustom": _top_k_top_p("torch.ops._C_ascend.npu_apply_top_k_top_p",
                                        ("torch_npu", "vllm_ascend.vllm_ascend_C")),
    "LightningIndexer": _lightning_indexer,
    "SparseFlashAttention": _sparse_flash_attention,
}

build_call, build_case = hook_entry_points(_BUILDERS)
