"""TensorCast's paged-KV-cache ops computed for real, so their recorded queries can be replayed and timed.

msmodeling's runner writes the cache with `tensor_cast.reshape_and_cache` and reads it with `tensor_cast.attention`
(schemas: msmodeling's `tensor_cast/ops/attention.py`); both are placeholders there. These are the computations a
serving engine runs for them, in torch alone so they run on cpu and cuda:

- `reshape_and_cache`: the new tokens' keys and values land in their slots (slot = block * block_size + offset;
  `kv_cache[0]` holds keys, `kv_cache[1]` values) through one `index_copy_` per half.
- `paged_attention`: each sequence's blocks are gathered with `index_select` (the copy a paged kernel avoids,
  here part of the replayed work) and attended with `F.scaled_dot_product_attention`, causal within the sequence
  (query token i of a sequence of context L and q_len new tokens sees keys 0 .. L - q_len + i).

Kernels chosen by measurement (torch 2.13 CPU, one thread, on the 2-core EPYC VM under other load: best of 15
calls in 3 interleaved rounds; us, bf16; tiny = 4 heads / 2 KV heads x 16, 8B-class = 32 / 8 x 128, block 128):

    case                 chosen  loop+gqa(4-D)  loop+gqa(3-D)  loop+repeat_kv  loop+fold  one call+gqa
    tiny decode 4x513        87            276            265             329        139           206
    tiny decode 32x1025     903           3669           2806            4276       1462          2861
    8B decode 8x1025       6106          74551          52763           60850       6996         80719
    tiny prefill 1024      3624           3632          14827            3813       7783 (fold+mask)
    8B prefill 512        53297          52776          89022           53405      52404 (fold+mask)

- Decode (q_len 1) folds each KV head's query-head group into the query-length axis, [B, Hkv, G, D] against
  [B, Hkv, L, D]: a plain MHA call, exact since every query row sees every key; `enable_gqa=True` is up to 10x
  slower there on CPU (bf16). A decode batch of one context length goes several sequences a call, up to
  CPU_GATHER_BYTES of gathered K/V (one call for all is 3x slower once the gather leaves the L2 cache); other
  devices take the whole batch in one call.
- Prefill (q_len == L) uses `is_causal=True, enable_gqa=True` on 4-D tensors (torch sends 3-D inputs to its
  math kernel: 2-4x slower); chunked prefill (1 < q_len < L) passes the lower-right causal mask explicitly.
- Mixed batches go sequence by sequence, each by the rule above.
fp32 ranks the same. On cuda (H200, torch 2.11) the same code agrees with the reference at the same tolerances;
there the gather dominates decode (8B-class bf16, 64 x 4097: 1027 us a call, of which 619 us gathering K/V and
269 us in SDPA; 256 x 2049: 1859 / 1194 / 528 us), so a kernel that reads the blocks in place (flex_attention
with a block mask, `varlen_attn` with `block_table`) is the next choice for cuda. Prefill 2048 / 8192 tokens:
176 / 1041 us.
"""

from __future__ import annotations

import math
from itertools import accumulate

import torch
import torch.nn.functional as F

from opperf.errors import OpperfError

# K/V one decode call gathers on cpu: calls of 1-4 MiB were fastest (the EPYC VM's L2 is 2 MiB a core), 16 MiB and
# more up to 3x slower (K/V of 8B-class sequences at 2049 tokens, one call for 16 sequences vs one per sequence).
CPU_GATHER_BYTES = 4 * 2**20


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """Write token t's key and value into slot `slot_mapping[t]` of `kv_cache` [2, blocks, block_size, Hkv, D].

    `key`/`value` are [tokens, Hkv * D] as TensorCast passes them. Every slot must be valid (TensorCast maps
    every new token; vLLM's padding slot -1 is not modelled)."""
    _, num_blocks, block_size, kv_heads, head_dim = kv_cache.shape
    slots = kv_cache.view(2, num_blocks * block_size, kv_heads, head_dim)
    slots[0].index_copy_(0, slot_mapping, key.view(-1, kv_heads, head_dim))
    slots[1].index_copy_(0, slot_mapping, value.view(-1, kv_heads, head_dim))


def paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_table: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    query_lens: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its paged context; returns [tokens, Hq * D].

    query [tokens, Hq * D]; key_cache/value_cache [blocks, block_size, Hkv, D]; block_table [batch, max_blocks];
    query_start_loc [batch + 1]; seq_lens (context including the new tokens) and query_lens [batch]. The lengths
    are read on the host (`tolist`): keep them on the cpu to spare a device sync, as vLLM keeps `seq_lens_cpu`."""
    block_size, kv_heads, head_dim = key_cache.shape[1:]
    query_heads, remainder = divmod(query.shape[1], head_dim)
    if remainder or query_heads % kv_heads:
        raise ValueError(f"query width {query.shape[1]} is not a multiple of head_dim {head_dim} times the "
                         f"{kv_heads} KV heads of the cache")
    starts = [int(x) for x in query_start_loc.tolist()]
    lengths = [int(x) for x in seq_lens.tolist()]
    new_tokens = [int(x) for x in query_lens.tolist()]
    _check_batch(query, block_table, block_size, starts, lengths, new_tokens)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    if all(n == 1 for n in new_tokens) and len(set(lengths)) == 1:
        return _uniform_decode(query, key_cache, value_cache, block_table, lengths[0], scale)
    output = torch.empty_like(query)
    for sequence, (start, context, count) in enumerate(zip(starts, lengths, new_tokens)):
        if count == 0:
            continue
        blocks = block_table[sequence, :_blocks_for(context, block_size)]
        keys = _gather(key_cache, blocks, context).unsqueeze(0)
        values = _gather(value_cache, blocks, context).unsqueeze(0)
        tokens = query[start:start + count]
        if count == 1:
            attended = F.scaled_dot_product_attention(
                tokens.view(1, kv_heads, query_heads // kv_heads, head_dim), keys, values, scale=scale)
        else:
            grouped = tokens.view(1, count, query_heads, head_dim).transpose(1, 2)
            if count == context:
                attended = F.scaled_dot_product_attention(grouped, keys, values, is_causal=True, scale=scale,
                                                          enable_gqa=True)
            else:
                attended = F.scaled_dot_product_attention(grouped, keys, values, scale=scale, enable_gqa=True,
                                                          attn_mask=_lower_right_causal(count, context, query))
            attended = attended.transpose(1, 2)
        output[start:start + count] = attended.reshape(count, query_heads * head_dim)
    return output


def _check_batch(query, block_table, block_size, starts, lengths, new_tokens) -> None:
    """One clear error for metadata that does not describe the query and block table it came with."""
    batch = len(lengths)
    if len(new_tokens) != batch or len(starts) != batch + 1 or block_table.shape[0] < batch:
        raise ValueError(f"batch metadata disagrees: {len(lengths)} seq_lens, {len(new_tokens)} query_lens, "
                         f"{len(starts)} query_start_loc entries, {block_table.shape[0]} block table rows")
    for sequence, (context, count) in enumerate(zip(lengths, new_tokens)):
        if starts[sequence + 1] - starts[sequence] != count or not 0 <= count <= context:
            raise ValueError(f"sequence {sequence}: query_start_loc {starts[sequence]}..{starts[sequence + 1]}, "
                             f"query_len {count}, seq_len {context} do not fit together")
        if _blocks_for(context, block_size) > block_table.shape[1]:
            raise ValueError(f"sequence {sequence}: seq_len {context} needs {_blocks_for(context, block_size)} "
                             f"blocks of {block_size}, the block table has {block_table.shape[1]} columns")
    if starts[0] != 0 or starts[-1] != query.shape[0]:
        raise ValueError(f"query_start_loc spans {starts[0]}..{starts[-1]}, the query has {query.shape[0]} tokens")


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _gather(cache: torch.Tensor, blocks: torch.Tensor, context: int) -> torch.Tensor:
    """One sequence's first `context` cached tokens as [Hkv, context, D]."""
    kv_heads, head_dim = cache.shape[2:]
    return cache.index_select(0, blocks).view(-1, kv_heads, head_dim)[:context].transpose(0, 1)


def _lower_right_causal(count: int, context: int, like: torch.Tensor) -> torch.Tensor:
    """[count, context] boolean mask: query token i sees keys up to context - count + i."""
    rows = torch.arange(count, device=like.device).unsqueeze(1)
    columns = torch.arange(context, device=like.device).unsqueeze(0)
    return columns <= rows + (context - count)


def _uniform_decode(query, key_cache, value_cache, block_table, context, scale) -> torch.Tensor:
    """A decode batch of one context length, several sequences a call: each KV head's query group rides the
    length axis. On cpu a call gathers at most CPU_GATHER_BYTES of K/V (at least one sequence)."""
    block_size, kv_heads, head_dim = key_cache.shape[1:]
    batch = query.shape[0]
    blocks = _blocks_for(context, block_size)
    per_sequence = 2 * context * kv_heads * head_dim * key_cache.element_size()
    step = max(1, CPU_GATHER_BYTES // per_sequence) if query.device.type == "cpu" else batch
    output = torch.empty_like(query)
    for first in range(0, batch, step):
        count = min(step, batch - first)
        flat_blocks = block_table[first:first + count, :blocks].reshape(-1)

        def gathered(cache):
            return cache.index_select(0, flat_blocks).view(count, blocks * block_size, kv_heads, head_dim)[
                :, :context].transpose(1, 2)

        grouped = query[first:first + count].view(count, kv_heads, -1, head_dim)
        attended = F.scaled_dot_product_attention(grouped, gathered(key_cache), gathered(value_cache), scale=scale)
        output[first:first + count] = attended.reshape(count, -1)
    return output


def step_lengths(calls: list[dict]) -> tuple[list[int], list[int]]:
    """seq_lens and query_lens of a recorded step, from its first `tensor_cast.attention` call: what
    `reshape_and_cache`'s own arguments do not carry."""
    for call in calls:
        if _op_name(call) == "tensor_cast.attention":
            args = call["args"]
            return _values(args[6], call, "seq_lens"), _values(args[7], call, "query_lens")
    raise OpperfError("the recorded calls hold no tensor_cast.attention call to take seq_lens/query_lens from")


def build_inputs(call: dict, device: str | torch.device = "cpu", *, dtype: torch.dtype | None = None,
                 seq_lens: list[int] | None = None, query_lens: list[int] | None = None,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Real tensors for one recorded `tensor_cast.attention` or `tensor_cast.reshape_and_cache` call, as the
    keyword arguments of `paged_attention` / `reshape_and_cache`.

    `call` is one entry of msmodeling_record.py's "calls". q/k/v and the caches are random (`dtype` overrides
    the recorded float dtype: TensorCast records float16, databases are bfloat16). Block tables were on the meta
    device, so they are laid out as a fresh serving engine lays them: each sequence its own consecutive blocks.
    msmodeling sizes the cache by tokens (ceil((seq_len + 1) * batch / block_size): 17 blocks for 4 x 513 at 128),
    which can be fewer than the per-sequence blocks (4 x 5 = 20); the cache then grows to what the table needs,
    since sharing blocks between sequences would replay a different memory traffic. The slot mapping puts each
    sequence's new tokens after its context (positions L - q_len .. L - 1). `reshape_and_cache` carries no
    lengths: pass the step's (`step_lengths`), else its tokens are one sequence's prefill. Lengths stay on the
    cpu (see `paged_attention`)."""
    op = _op_name(call)
    args = call.get("args") or []
    generator = torch.Generator(device=device).manual_seed(seed)
    if op == "tensor_cast.attention":
        if len(args) != 8:
            raise OpperfError(f"{op}: expected 8 recorded arguments, found {len(args)}")
        if args[3] is not None:
            raise OpperfError(f"{op}: recorded attention_mask {args[3]} is not None; only the paged, maskless "
                              "form TensorCast issues with a KV cache is replayed")
        query_spec, key_spec = _spec(args[0], call, "query"), _spec(args[1], call, "key_cache")
        lengths, counts = _values(args[6], call, "seq_lens"), _values(args[7], call, "query_lens")
        num_blocks, block_size, kv_heads, head_dim = key_spec["shape"]
        table_width = _spec(args[4], call, "block_table")["shape"][1]
        _check_recorded(call, lengths, counts, query_spec["shape"][0], block_size, table_width)
        block_table, _ = _layout(lengths, counts, block_size, table_width)
        num_blocks = max(num_blocks, int(block_table.max()) + 1)
        float_dtype = dtype or _dtype(key_spec, call)
        cache = _random((2, num_blocks, block_size, kv_heads, head_dim), float_dtype, generator)
        return {"query": _random(query_spec["shape"], dtype or _dtype(query_spec, call), generator),
                "key_cache": cache[0], "value_cache": cache[1],
                "block_table": block_table.to(device),
                "query_start_loc": torch.tensor([0, *accumulate(counts)], dtype=torch.int64),
                "seq_lens": torch.tensor(lengths, dtype=torch.int64),
                "query_lens": torch.tensor(counts, dtype=torch.int64)}
    if op == "tensor_cast.reshape_and_cache":
        if len(args) != 4:
            raise OpperfError(f"{op}: expected 4 recorded arguments, found {len(args)}")
        key_spec, value_spec = _spec(args[0], call, "key"), _spec(args[1], call, "value")
        cache_spec = _spec(args[2], call, "kv_cache")
        tokens = key_spec["shape"][0]
        lengths = list(seq_lens) if seq_lens is not None else [tokens]
        counts = list(query_lens) if query_lens is not None else [tokens]
        _, num_blocks, block_size, kv_heads, head_dim = cache_spec["shape"]
        _check_recorded(call, lengths, counts, tokens, block_size, None)
        block_table, slot_mapping = _layout(lengths, counts, block_size, None)
        num_blocks = max(num_blocks, int(block_table.max()) + 1)
        return {"key": _random(key_spec["shape"], dtype or _dtype(key_spec, call), generator),
                "value": _random(value_spec["shape"], dtype or _dtype(value_spec, call), generator),
                "kv_cache": _random((2, num_blocks, block_size, kv_heads, head_dim),
                                    dtype or _dtype(cache_spec, call), generator),
                "slot_mapping": slot_mapping.to(device)}
    raise OpperfError(f"{op!r} is not a TensorCast paged-cache op (tensor_cast.attention, "
                      "tensor_cast.reshape_and_cache)")


KERNELS = {"tensor_cast.attention": paged_attention, "tensor_cast.reshape_and_cache": reshape_and_cache}


def _op_name(call: dict) -> str:
    return str(call.get("op", "")).removesuffix(".default")


def _spec(argument, call: dict, name: str) -> dict:
    if not isinstance(argument, dict) or "shape" not in argument:
        raise OpperfError(f"{_op_name(call)}: recorded {name} is {argument!r}, not a tensor")
    return argument


def _values(argument, call: dict, name: str) -> list[int]:
    values = _spec(argument, call, name).get("values")
    if values is None:
        raise OpperfError(f"{_op_name(call)}: recorded {name} has no values (it was on the meta device); "
                          "record with msmodeling_record.py, which keeps small integer metadata")
    return [int(x) for x in values]


def _dtype(spec: dict, call: dict) -> torch.dtype:
    dtype = getattr(torch, str(spec.get("dtype")), None)
    if not isinstance(dtype, torch.dtype):
        raise OpperfError(f"{_op_name(call)}: recorded dtype {spec.get('dtype')!r} is not a torch dtype")
    return dtype


def _check_recorded(call, lengths, counts, tokens, block_size, table_width) -> None:
    if len(lengths) != len(counts) or sum(counts) != tokens or any(not 0 <= n <= s for s, n in zip(lengths, counts)):
        raise OpperfError(f"{_op_name(call)}: seq_lens {lengths} and query_lens {counts} do not describe "
                          f"{tokens} new tokens")
    if table_width is not None and max(_blocks_for(s, block_size) for s in lengths) > table_width:
        raise OpperfError(f"{_op_name(call)}: seq_lens {lengths} need more than the block table's {table_width} "
                          f"blocks of {block_size}")


def _layout(lengths: list[int], counts: list[int], block_size: int,
            table_width: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Block table (each sequence its own consecutive blocks, unused columns 0) and the new tokens' slots."""
    needed = [_blocks_for(context, block_size) for context in lengths]
    width = table_width or max(needed)
    block_table = torch.zeros(len(lengths), width, dtype=torch.int64)
    slots = []
    first = 0
    for sequence, (context, count, blocks) in enumerate(zip(lengths, counts, needed)):
        block_table[sequence, :blocks] = torch.arange(first, first + blocks)
        positions = torch.arange(context - count, context)
        slots.append(block_table[sequence, positions // block_size] * block_size + positions % block_size)
        first += blocks
    return block_table, torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64)


def _random(shape, dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Normal values drawn where the tensor lives (a multi-GiB cache is not drawn on the host and copied)."""
    return torch.randn(tuple(shape), generator=generator, dtype=dtype, device=generator.device)
