"""The paged decode/prefill step (opperf.workload.paged_step): a transformers model whose attention writes and reads
a paged KV cache through opperf's replay kernels of tensor_cast.reshape_and_cache / tensor_cast.attention, the step
msmodeling's runner predicts. Tiny configs on cpu."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO

transformers = pytest.importorskip("transformers")

from opperf.errors import OpperfError  # noqa: E402
from opperf.workload.paged_step import PagedTransformersCausalLM  # noqa: E402
from opperf.workload.transformers_model import TransformersCausalLM, read_config  # noqa: E402

CONFIGS = REPO / "tests" / "data" / "workload"
DENSE_AND_MOE = [("tiny_mistral.json", torch.float32), ("tiny_qwen3_moe.json", torch.bfloat16)]


def _models(name, dtype, **steps):
    """The paged model and the same model (same seed, so the same weights) with sdpa attention and DynamicCache."""
    config = read_config(CONFIGS / name)
    paged = PagedTransformersCausalLM(config, "cpu", dtype, seed=3, **steps)
    reference = TransformersCausalLM(config, "cpu", dtype, seed=3)
    assert reference.description["attn_implementation"] == "sdpa"
    assert paged.description["attn_implementation"] == "opperf_paged"
    return paged, reference


def _dynamic_cache_like(paged_cache, reference, batch, context):
    """A DynamicCache holding the keys and values of the paged cache's first `context` positions."""
    table = paged_cache.step(batch, context, 1).block_table
    dynamic = transformers.DynamicCache(config=reference.model.config)
    for index, kv_cache in enumerate(paged_cache.layers):
        kv_heads, head_dim = kv_cache.shape[3:]
        keys, values = (kv_cache[half][table].reshape(batch, -1, kv_heads, head_dim)[:, :context].transpose(1, 2)
                        for half in (0, 1))
        dynamic.update(keys.clone(), values.clone(), index)
    return dynamic


@pytest.mark.parametrize("name, dtype", DENSE_AND_MOE)
def test_the_paged_prefill_gives_the_logits_of_transformers_sdpa(name, dtype):
    paged, reference = _models(name, dtype, prefill_batch=2, prefill_lengths=(20, 150))
    generator = torch.Generator().manual_seed(0)
    for length in (20, 150):                  # one block, and two (the second one partly filled)
        ids = torch.randint(0, paged.vocab_size, (2, length), generator=generator)
        logits, _ = paged.forward(ids, 0, paged.new_cache())
        expected, _ = reference.forward(ids, 0, None)
        torch.testing.assert_close(logits, expected)


@pytest.mark.parametrize("name, dtype", DENSE_AND_MOE)
def test_paged_decode_steps_give_the_logits_of_transformers_sdpa_over_the_same_keys_and_values(name, dtype):
    """Three sequences whose context of 127 tokens fills their first block but one slot: the first step writes the
    last slot, the second a new block and reads the first step's keys and values back (reshape_and_cache's slots
    and paged_attention's block table agree)."""
    batch, context = 3, 127
    paged, reference = _models(name, dtype, decode_steps=2)
    cache = paged.written_cache(batch, context, torch.Generator().manual_seed(1)).cache
    assert [tuple(layer.shape) for layer in cache.layers] == [(2, 6, 128, 2, 16)] * 2      # 2 blocks a sequence
    dynamic = _dynamic_cache_like(cache, reference, batch, context)
    generator = torch.Generator().manual_seed(2)
    for step in range(2):
        ids = torch.randint(0, paged.vocab_size, (batch, 1), generator=generator)
        logits, _ = paged.forward(ids, context + step, cache)
        with torch.inference_mode():
            expected = reference.model(input_ids=ids, past_key_values=dynamic, use_cache=True, logits_to_keep=1).logits
        torch.testing.assert_close(logits, expected)
    assert dynamic.get_seq_length() == context + 2


def _step_ops(model, ids, start, cache, trace_path):
    """(op name, input dims) of every aten op of one step's torch.profiler Chrome trace (record_shapes; a tensor
    list's dims are a list of dims)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profiler:
        model.forward(ids, start, cache)
    profiler.export_chrome_trace(str(trace_path))
    events = json.loads(trace_path.read_text())["traceEvents"]
    return [(event["name"], _tuples(event["args"]["Input Dims"])) for event in events
            if event.get("cat") == "cpu_op" and event["name"].startswith("aten::")]


def _tuples(dims):
    """Input Dims as tuples: [[2, 3], []] -> ((2, 3), ()); a tensor list's stays a tuple of them."""
    return tuple(_tuples(d) for d in dims) if dims and isinstance(dims[0], list) else tuple(dims)


def _whole_cache_cats(ops, tokens):
    """The cats with an input holding `tokens` positions (a KV cache's length, not a rotary half's)."""
    return [(name, dims) for name, dims in ops if name == "aten::cat" and any(tokens in d for d in dims[0])]


def test_a_paged_decode_step_runs_the_paged_kernels_and_no_whole_cache_cat(tmp_path):
    """Decode, batch 2 over 130 tokens (2 blocks each): every layer writes its new keys and values into their slots
    (index_copy_ into [blocks * 128, kv_heads, head_dim]), gathers each sequence's blocks (index_select) and attends
    with SDPA over the 131 tokens; nothing concatenates the cache, as transformers' DynamicCache does every step."""
    batch, context, layers = 2, 130, 2
    paged, reference = _models("tiny_mistral.json", torch.float32, decode_steps=1)
    cache = paged.written_cache(batch, context).cache
    ids = torch.ones(batch, 1, dtype=torch.long)
    ops = _step_ops(paged, ids, context, cache, tmp_path / "paged.json")
    num_blocks = cache.layers[0].shape[1]
    assert ops.count(("aten::index_copy_", ((num_blocks * 128, 2, 16), (), (batch,), (batch, 2, 16)))) == 2 * layers
    assert ops.count(("aten::index_select", ((num_blocks, 128, 2, 16), (), (batch * 2,)))) == 2 * layers
    assert [dims[:3] for name, dims in ops if name == "aten::scaled_dot_product_attention"] == [
        ((batch, 2, 2, 16), (batch, 2, context + 1, 16), (batch, 2, context + 1, 16))] * layers
    assert not _whole_cache_cats(ops, context) and not _whole_cache_cats(ops, context + 1)
    # The same check finds DynamicCache's cat (keys and values of each layer) in transformers' own step.
    dynamic = _dynamic_cache_like(cache, reference, batch, context)
    dynamic_ops = _step_ops(reference, ids, context, dynamic, tmp_path / "dynamic.json")
    assert len(_whole_cache_cats(dynamic_ops, context)) == 2 * layers


def test_profile_workload_kv_cache_paged_writes_a_profile_the_parse_reads(tmp_path):
    profile, database = tmp_path / "profile", tmp_path / "db"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "profile_workload.py"), "--transformers-config",
                          str(CONFIGS / "tiny_qwen3_moe.json"), "--kv-cache", "paged", "--prefill-lengths", "24",
                          "--decode-steps", "1", "--decode-context", "8", "--output", str(profile)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    manifest = json.loads((profile / "workload.json").read_text())
    assert manifest["attn_implementation"] == "opperf_paged"
    assert manifest["kv_cache"] == {"kind": "paged", "block_size": 128,
                                    "attention": "opperf.consumer.paged_attention.paged_attention",
                                    "cache_write": "opperf.consumer.paged_attention.reshape_and_cache"}
    assert "in a paged cache of 128-token blocks" in manifest["decode_cache"]["cache"]
    parse = subprocess.run([sys.executable, str(REPO / "scripts" / "parse_kernel_details.py"), "--profiling-path",
                            str(profile / "trace.json"), "--database-path", str(database)],
                           capture_output=True, text=True, timeout=600)
    assert parse.returncode == 0, parse.stderr
    with open(database / "index_copy_.csv", newline="") as handle:
        writes = sorted(row["Input Shapes"] for row in csv.DictReader(handle))
    # The slot writes of the prefill (24 tokens) and the decode step (1), into the one block of each cache.
    assert writes == ["128,2,16;;1;1,2,16", "128,2,16;;24;24,2,16"]


def test_a_dynamic_profile_says_so():
    model = TransformersCausalLM(read_config(CONFIGS / "tiny_mistral.json"), "cpu", torch.float32)
    assert model.description["kv_cache"] == {"kind": "dynamic"}


@pytest.mark.parametrize("arguments, message", [
    (["--transformers-config", str(CONFIGS / "tiny_gpt_oss.json")],
     f"error: {CONFIGS / 'tiny_gpt_oss.json'}: GptOssAttention (layer 0) uses attention sinks (s_aux), which paged "
     "attention (tensor_cast.attention) does not compute; profile it with --kv-cache dynamic"),
    (["--transformers-config", str(CONFIGS / "tiny_deepseek_v4.json")],
     f"error: {CONFIGS / 'tiny_deepseek_v4.json'}: DeepseekV4ForCausalLM: its compressed_sparse_attention, "
     "heavily_compressed_attention layers are not the full or sliding-window attention paged attention computes; "
     "profile it with --kv-cache dynamic"),
    ([], "error: field '--kv-cache': a paged KV cache is for a transformers model: give --transformers-config"),
])
def test_a_model_paged_attention_does_not_compute_is_refused_in_one_line(tmp_path, arguments, message):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "profile_workload.py"), *arguments, "--kv-cache",
                          "paged", "--output", str(tmp_path / "profile")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1] == message
    assert not (tmp_path / "profile").exists()


def test_a_sliding_window_shorter_than_the_context_is_refused():
    config = read_config(CONFIGS / "tiny_mistral.json")
    config["sliding_window"] = 64
    model = PagedTransformersCausalLM(config, "cpu", torch.float32, decode_steps=1)
    model.forward(torch.ones(1, 1, dtype=torch.long), 63, model.written_cache(1, 63).cache)     # 64 tokens: fine
    with pytest.raises(OpperfError, match="MistralAttention \\(layer 0\\) attends a sliding window of 64 tokens, "
                                          "paged attention the whole context of 65; profile it with --kv-cache "
                                          "dynamic"):
        model.forward(torch.ones(1, 1, dtype=torch.long), 64, model.written_cache(1, 64).cache)
