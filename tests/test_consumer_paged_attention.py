"""TensorCast's paged-cache ops computed for real: paged attention agrees with plain causal attention over
contiguous K/V (prefill, decode, mixed, GQA), the cache write touches exactly the mapped slots, and recorded calls
become tensors of the runner's shapes."""

from __future__ import annotations

import pytest
import torch

from opperf.consumer import paged_attention as paged_attention_module
from opperf.consumer.paged_attention import build_inputs, paged_attention, reshape_and_cache, step_lengths
from opperf.errors import OpperfError

QUERY_HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 4, 2, 16, 16

# The runner's calls for the tiny dense model (4 heads, 2 KV heads, head_dim 16, float16, block size 128), as
# msmodeling_record.py writes them: decode of 4 sequences at context 512, and a 64-token prefill.
DECODE_ATTENTION = {"op": "tensor_cast.attention.default", "args": [
    {"shape": [4, 64], "dtype": "float16"}, {"shape": [17, 128, 2, 16], "dtype": "float16"},
    {"shape": [17, 128, 2, 16], "dtype": "float16"}, None, {"shape": [4, 5], "dtype": "int64"},
    {"shape": [5], "dtype": "int64", "values": [0, 1, 2, 3, 4]},
    {"shape": [4], "dtype": "int64", "values": [513, 513, 513, 513]},
    {"shape": [4], "dtype": "int64", "values": [1, 1, 1, 1]}]}
DECODE_CACHE_WRITE = {"op": "tensor_cast.reshape_and_cache.default", "args": [
    {"shape": [4, 32], "dtype": "float16"}, {"shape": [4, 32], "dtype": "float16"},
    {"shape": [2, 17, 128, 2, 16], "dtype": "float16"}, {"shape": [4], "dtype": "int64"}]}
PREFILL_ATTENTION = {"op": "tensor_cast.attention.default", "args": [
    {"shape": [64, 64], "dtype": "float16"}, {"shape": [1, 128, 2, 16], "dtype": "float16"},
    {"shape": [1, 128, 2, 16], "dtype": "float16"}, None, {"shape": [1, 1], "dtype": "int64"},
    {"shape": [2], "dtype": "int64", "values": [0, 64]}, {"shape": [1], "dtype": "int64", "values": [64]},
    {"shape": [1], "dtype": "int64", "values": [64]}]}


def paged_batch(seq_lens, query_lens, dtype, seed=0):
    """Contiguous per-sequence K/V and the same K/V scattered over shuffled cache blocks, with decoy blocks
    that hold no sequence's tokens (huge values: reading one shows in the output)."""
    generator = torch.Generator().manual_seed(seed)
    blocks_needed = [-(-length // BLOCK_SIZE) for length in seq_lens]
    num_blocks = sum(blocks_needed) + 3
    key_cache = torch.full((num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM), 1e4)
    value_cache = torch.full_like(key_cache, -1e4)
    order = torch.randperm(num_blocks, generator=generator)
    block_table = torch.zeros(len(seq_lens), max(blocks_needed), dtype=torch.int64)
    keys, values, used = [], [], 0
    for sequence, (length, blocks) in enumerate(zip(seq_lens, blocks_needed)):
        block_table[sequence, :blocks] = order[used:used + blocks]
        used += blocks
        key = torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator)
        value = torch.randn(length, KV_HEADS, HEAD_DIM, generator=generator)
        for position in range(length):
            block = block_table[sequence, position // BLOCK_SIZE]
            key_cache[block, position % BLOCK_SIZE] = key[position]
            value_cache[block, position % BLOCK_SIZE] = value[position]
        keys.append(key.to(dtype))
        values.append(value.to(dtype))
    query = torch.randn(sum(query_lens), QUERY_HEADS * HEAD_DIM, generator=generator).to(dtype)
    metadata = {"block_table": block_table,
                "query_start_loc": torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()]),
                "seq_lens": torch.tensor(seq_lens), "query_lens": torch.tensor(query_lens)}
    return query, key_cache.to(dtype), value_cache.to(dtype), metadata, keys, values


def reference_attention(query, keys, values, seq_lens, query_lens):
    """Per-sequence causal attention over contiguous K/V in float64, written out (no SDPA): query token i of a
    sequence with context L and q new tokens sees keys 0 .. L - q + i; query head h reads KV head h // group."""
    group = QUERY_HEADS // KV_HEADS
    outputs, start = [], 0
    for key, value, length, count in zip(keys, values, seq_lens, query_lens):
        tokens = query[start:start + count].double().view(count, QUERY_HEADS, HEAD_DIM).transpose(0, 1)
        key = key.double().transpose(0, 1).repeat_interleave(group, 0)
        value = value.double().transpose(0, 1).repeat_interleave(group, 0)
        scores = tokens @ key.transpose(1, 2) / HEAD_DIM ** 0.5
        visible = torch.arange(length).unsqueeze(0) <= torch.arange(count).unsqueeze(1) + (length - count)
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        outputs.append((weights @ value).transpose(0, 1).reshape(count, QUERY_HEADS * HEAD_DIM))
        start += count
    return torch.cat(outputs)


# fp32: torch's own. bf16: an output is a weighted mean of O(1) values and the kernel rounds its intermediates to
# bf16, so its error scales with the values, not with the (possibly near-zero) mean: half a bf16 step at 1.0
# absolute. A wrong mask, block or head group moves outputs by O(0.1).
TOLERANCES = {torch.float32: {}, torch.bfloat16: {"atol": 4e-3, "rtol": 1.6e-2}}

BATCHES = {
    "prefill": ([37, 64], [37, 64]),
    "decode_one_context": ([50, 50, 50, 50], [1, 1, 1, 1]),
    "decode_ragged": ([50, 17, 33], [1, 1, 1]),
    "mixed": ([20, 41, 45, 1], [20, 1, 7, 1]),   # prefill, decode, chunked prefill, first token
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("batch", BATCHES)
def test_paged_attention_matches_causal_attention_over_contiguous_kv(batch, dtype):
    seq_lens, query_lens = BATCHES[batch]
    query, key_cache, value_cache, metadata, keys, values = paged_batch(seq_lens, query_lens, dtype)
    output = paged_attention(query, key_cache, value_cache, **metadata)
    assert output.shape == query.shape and output.dtype == dtype
    expected = reference_attention(query, keys, values, seq_lens, query_lens).to(dtype)
    torch.testing.assert_close(output, expected, **TOLERANCES[dtype])


def test_uniform_decode_split_into_calls_agrees(monkeypatch):
    """A decode batch too large for one cpu call goes in chunks (here 3 + 1 sequences) with the same answer."""
    seq_lens, query_lens = [50] * 4, [1] * 4
    query, key_cache, value_cache, metadata, keys, values = paged_batch(seq_lens, query_lens, torch.float32)
    monkeypatch.setattr(paged_attention_module, "CPU_GATHER_BYTES", 3 * 2 * 50 * KV_HEADS * HEAD_DIM * 4)
    output = paged_attention(query, key_cache, value_cache, **metadata)
    torch.testing.assert_close(output, reference_attention(query, keys, values, seq_lens, query_lens).float())


def test_paged_attention_scale_is_applied():
    seq_lens, query_lens = [9, 30], [9, 1]
    query, key_cache, value_cache, metadata, keys, values = paged_batch(seq_lens, query_lens, torch.float32)
    output = paged_attention(query, key_cache, value_cache, **metadata, scale=0.5 / HEAD_DIM ** 0.5)
    expected = reference_attention(query * 0.5, keys, values, seq_lens, query_lens).float()
    torch.testing.assert_close(output, expected)


def test_paged_attention_rejects_metadata_that_disagrees_with_the_query():
    query, key_cache, value_cache, metadata, _, _ = paged_batch([20, 41], [20, 1], torch.float32)
    metadata["query_lens"] = torch.tensor([20, 2])
    with pytest.raises(ValueError, match="sequence 1: query_start_loc 20..21, query_len 2, seq_len 41"):
        paged_attention(query, key_cache, value_cache, **metadata)


def test_reshape_and_cache_writes_exactly_the_mapped_slots():
    num_blocks, block_size = 5, 4
    kv_cache = torch.randn(2, num_blocks, block_size, KV_HEADS, HEAD_DIM)
    before = kv_cache.clone()
    slot_mapping = torch.tensor([17, 2, 8, 19])   # blocks 4, 0, 2, 4 at offsets 1, 2, 0, 3
    key = torch.randn(4, KV_HEADS * HEAD_DIM)
    value = torch.randn(4, KV_HEADS * HEAD_DIM)
    reshape_and_cache(key, value, kv_cache, slot_mapping)
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[slot_mapping] = True
    flat, flat_before = kv_cache.view(2, -1, KV_HEADS, HEAD_DIM), before.view(2, -1, KV_HEADS, HEAD_DIM)
    assert torch.equal(flat[:, ~written], flat_before[:, ~written])
    assert torch.equal(flat[0, slot_mapping], key.view(4, KV_HEADS, HEAD_DIM))
    assert torch.equal(flat[1, slot_mapping], value.view(4, KV_HEADS, HEAD_DIM))
    assert torch.equal(kv_cache[0, 4, 1].reshape(-1), key[0])   # slot 17 = block 4 * 4 + offset 1


def test_build_inputs_decode_gives_the_runner_shapes_and_distinct_blocks():
    inputs = build_inputs(DECODE_ATTENTION, dtype=torch.bfloat16)
    assert inputs["query"].shape == (4, 64) and inputs["query"].dtype == torch.bfloat16
    # msmodeling sizes the cache by tokens (17 blocks); 4 sequences of 513 tokens need 5 blocks each of their own.
    assert inputs["key_cache"].shape == inputs["value_cache"].shape == (20, 128, 2, 16)
    assert inputs["block_table"].tolist() == [list(range(first, first + 5)) for first in (0, 5, 10, 15)]
    assert inputs["query_start_loc"].tolist() == [0, 1, 2, 3, 4]
    assert inputs["seq_lens"].tolist() == [513] * 4 and inputs["query_lens"].tolist() == [1] * 4
    assert paged_attention(**inputs).shape == (4, 64)

    cache_write = build_inputs(DECODE_CACHE_WRITE, seq_lens=[513] * 4, query_lens=[1] * 4)
    assert cache_write["key"].shape == cache_write["value"].shape == (4, 32)
    assert cache_write["key"].dtype == torch.float16
    assert cache_write["kv_cache"].shape == (2, 20, 128, 2, 16)
    # token 513 of each sequence is position 512: its fifth block (0-based 4), offset 0
    assert cache_write["slot_mapping"].tolist() == [4 * 128, 9 * 128, 14 * 128, 19 * 128]
    reshape_and_cache(**cache_write)
    assert torch.equal(cache_write["kv_cache"][0, 9, 0].reshape(-1), cache_write["key"][1])


def test_build_inputs_prefill_keeps_the_recorded_shapes():
    inputs = build_inputs(PREFILL_ATTENTION)
    assert inputs["query"].shape == (64, 64) and inputs["key_cache"].shape == (1, 128, 2, 16)
    assert inputs["block_table"].tolist() == [[0]] and inputs["seq_lens"].tolist() == [64]
    assert inputs["key_cache"].untyped_storage().data_ptr() == inputs["value_cache"].untyped_storage().data_ptr()
    assert step_lengths([DECODE_CACHE_WRITE, PREFILL_ATTENTION]) == ([64], [64])
    cache_write = build_inputs({**DECODE_CACHE_WRITE, "args": [
        {"shape": [64, 32], "dtype": "float16"}, {"shape": [64, 32], "dtype": "float16"},
        {"shape": [2, 1, 128, 2, 16], "dtype": "float16"}, {"shape": [64], "dtype": "int64"}]})
    assert cache_write["slot_mapping"].tolist() == list(range(64))
    assert cache_write["kv_cache"].shape == (2, 1, 128, 2, 16)


def test_build_inputs_says_which_metadata_has_no_values():
    call = {**DECODE_ATTENTION, "args": [*DECODE_ATTENTION["args"][:6], {"shape": [4], "dtype": "int64"},
                                         DECODE_ATTENTION["args"][7]]}
    with pytest.raises(OpperfError, match=r"tensor_cast.attention: recorded seq_lens has no values"):
        build_inputs(call)
    with pytest.raises(OpperfError, match="'aten.mm' is not a TensorCast paged-cache op"):
        build_inputs({"op": "aten.mm.default", "args": []})
