"""A transformers model's step over a paged KV cache: the step msmodeling's runner predicts, measured.

TensorCast (msmodeling) swaps a transformers model's attention for `tensor_cast.attention` over a paged KV cache
([2, blocks, 128, kv_heads, head_dim] a layer) into which `tensor_cast.reshape_and_cache` writes each step's new
keys and values. opperf replays those two ops with `opperf.consumer.paged_attention` (the PagedAttention and
ReshapeAndCache kernel types). Profiling the model with transformers' own attention and DynamicCache (which
concatenates the whole cache every decode step) measures another computation than the one predicted, so here the
same model runs its attention through an `AttentionInterface` function that calls those very kernels: a database row
and the measured step's attention are the same computation.

The model keeps no cache of its own (`use_cache=False`, positions given): the layers' paged caches and each step's
metadata (block table, slots, lengths, positions) are made before the profile, so a step holds the model's kernels
alone. A decode cache holds `decode_context` tokens of random keys and values (written, not computed, as
written_kv_cache does for DynamicCache); a prefill's cache is empty (zeros).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from opperf.consumer.paged_attention import paged_attention, reshape_and_cache
from opperf.errors import OpperfError
from opperf.workload.model import WRITTEN_CONTEXT, WrittenCache, random_state
from opperf.workload.transformers_model import TransformersCausalLM

PAGED_ATTENTION = "opperf_paged"    # the attn_implementation name the function is registered under
BLOCK_SIZE = 128                    # TensorCast's (tensor_cast/core/input_generator.py)
PAGED_LAYER_TYPES = {"full_attention", "sliding_attention"}       # a config's layer_types paged attention computes
PAGED_CACHE_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")  # the transformers cache layers it replaces
UNPAGED = "profile it with --kv-cache dynamic"
KV_CACHE_NOTE = {"kind": "paged", "block_size": BLOCK_SIZE,
                 "attention": "opperf.consumer.paged_attention.paged_attention",
                 "cache_write": "opperf.consumer.paged_attention.reshape_and_cache"}


@dataclass(frozen=True)
class PagedStep:
    """One step's metadata, as a serving engine prepares it before the model runs. Lengths stay on the cpu
    (paged_attention reads them on the host)."""
    position_ids: torch.Tensor        # [batch, tokens]
    slot_mapping: torch.Tensor        # [batch * tokens]
    block_table: torch.Tensor         # [batch, ceil(seq_len / block_size)]
    query_start_loc: torch.Tensor     # [batch + 1]
    seq_lens: torch.Tensor            # [batch]: context including the new tokens
    query_lens: torch.Tensor          # [batch]
    longest: int                      # the longest seq_len, read without an op


@dataclass(frozen=True)
class LayerShape:
    """What a layer's cache holds, as its first call to the attention function showed it."""
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


class PagedKVCache:
    """Every layer's paged cache for `batch` sequences, and the metadata of the steps (start position, new tokens)
    it serves. Each sequence owns consecutive blocks, enough for its longest step, laid sequence after sequence;
    the cache holds at least TensorCast's ceil(batch * (tokens + 1) / block_size) blocks."""

    def __init__(self, layers: list[LayerShape], batch: int, steps: list[tuple[int, int]], device,
                 generator: torch.Generator | None = None):
        self.batch = batch
        longest = max(start + tokens for start, tokens in steps)
        per_sequence = math.ceil(longest / BLOCK_SIZE)
        table = torch.arange(batch * per_sequence, dtype=torch.int64).view(batch, per_sequence)
        num_blocks = max(batch * per_sequence, math.ceil(batch * (longest + 1) / BLOCK_SIZE))
        self.layers = []
        for layer in layers:
            shape = (2, num_blocks, BLOCK_SIZE, layer.kv_heads, layer.head_dim)
            self.layers.append(random_state(shape, layer.dtype, device, generator) if generator is not None
                               else torch.zeros(shape, dtype=layer.dtype, device=device))
        self.steps = {(start, tokens): _step_metadata(table, start, tokens, device) for start, tokens in steps}

    def step(self, batch: int, start: int, tokens: int) -> PagedStep:
        if batch != self.batch or (start, tokens) not in self.steps:
            raise OpperfError(f"the paged KV cache was made for {self.batch} sequences and the steps (start, tokens) "
                              f"{sorted(self.steps)}, not {batch} x ({start}, {tokens})")
        return self.steps[start, tokens]


def _step_metadata(table: torch.Tensor, start: int, tokens: int, device) -> PagedStep:
    batch = table.shape[0]
    positions = torch.arange(start, start + tokens, dtype=torch.int64)
    slots = table[:, positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE
    return PagedStep(position_ids=positions.expand(batch, tokens).to(device),
                     slot_mapping=slots.reshape(-1).to(device),
                     block_table=table[:, :math.ceil((start + tokens) / BLOCK_SIZE)].contiguous().to(device),
                     query_start_loc=torch.arange(0, batch * tokens + 1, tokens, dtype=torch.int64),
                     seq_lens=torch.full((batch,), start + tokens, dtype=torch.int64),
                     query_lens=torch.full((batch,), tokens, dtype=torch.int64), longest=start + tokens)


class ShapeProbe:
    """Passed instead of a cache, records each layer's cache shape; the attention returns zeros."""

    def __init__(self):
        self.layers: dict[int, LayerShape] = {}


def paged_attention_forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                            paged_kv_cache: PagedKVCache | ShapeProbe | None = None,
                            paged_step: PagedStep | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface ([batch, heads, tokens, head_dim] after rotary in, [batch, tokens, heads,
    head_dim] out) over layer `module.layer_idx`'s paged cache: the new keys and values into their slots
    (reshape_and_cache), then attention over each sequence's blocks (paged_attention), causal within it."""
    batch, heads, tokens, head_dim = query.shape
    layer = _checked_layer(module, query, key, value, attention_mask, kwargs, paged_step)
    if isinstance(paged_kv_cache, ShapeProbe):
        paged_kv_cache.layers[layer] = LayerShape(key.shape[1], head_dim, key.dtype)
        return query.new_zeros(batch, tokens, heads, head_dim), None
    if paged_kv_cache is None or paged_step is None:
        raise OpperfError(f"attn_implementation {PAGED_ATTENTION!r} needs the paged_kv_cache and paged_step "
                          "arguments (PagedTransformersCausalLM.forward passes them)")
    kv_cache = paged_kv_cache.layers[layer]
    # Named as msmodeling's runner names the two ops, so a profile's kernels pair with its answers
    # (benchmarks/e2e_prediction.py); the layout copies into TensorCast's [tokens, heads x head_dim] stay outside.
    keys, values, queries = _token_rows(key), _token_rows(value), _token_rows(query)
    with torch.profiler.record_function("tensor_cast.reshape_and_cache"):
        reshape_and_cache(keys, values, kv_cache, paged_step.slot_mapping)
    with torch.profiler.record_function("tensor_cast.attention"):
        output = paged_attention(queries, kv_cache[0], kv_cache[1], paged_step.block_table,
                                 paged_step.query_start_loc, paged_step.seq_lens, paged_step.query_lens,
                                 scale=scaling)
    return output.view(batch, tokens, heads, head_dim), None


def _token_rows(states: torch.Tensor) -> torch.Tensor:
    """[batch, heads, tokens, head_dim] as TensorCast's [batch * tokens, heads * head_dim]."""
    batch, heads, tokens, head_dim = states.shape
    return states.transpose(1, 2).reshape(batch * tokens, heads * head_dim)


def _checked_layer(module, query, key, value, attention_mask, kwargs: dict, step: PagedStep | None) -> int:
    """The layer index, or one clear error for an attention paged_attention does not compute."""
    name = type(module).__name__
    layer = getattr(module, "layer_idx", None)
    if not isinstance(layer, int):
        raise OpperfError(f"{name} has no layer_idx to find its paged KV cache by")
    refused = {"s_aux": "attention sinks", "softcap": "logit soft-capping"}
    for argument, what in refused.items():
        if kwargs.get(argument) is not None:
            raise OpperfError(f"{name} (layer {layer}) uses {what} ({argument}), which paged attention "
                              f"(tensor_cast.attention) does not compute; {UNPAGED}")
    window = kwargs.get("sliding_window")
    longest = step.longest if step is not None else 0
    if window is not None and window < longest:
        raise OpperfError(f"{name} (layer {layer}) attends a sliding window of {window} tokens, paged attention "
                          f"the whole context of {longest}; {UNPAGED}")
    if attention_mask is not None:
        raise OpperfError(f"{name} (layer {layer}) passes an attention mask; paged attention is causal within each "
                          "sequence and takes none")
    if key.shape[-1] != value.shape[-1] or key.shape[-1] != query.shape[-1]:
        raise OpperfError(f"{name} (layer {layer}): query/key/value head dims {query.shape[-1]}/{key.shape[-1]}/"
                          f"{value.shape[-1]} differ (MLA); the paged cache holds one head_dim")
    if query.shape[1] % key.shape[1]:
        raise OpperfError(f"{name} (layer {layer}): {query.shape[1]} query heads are not a multiple of "
                          f"{key.shape[1]} KV heads")
    return layer


def register_paged_attention() -> None:
    """Makes `attn_implementation=PAGED_ATTENTION` select paged_attention_forward. transformers builds no attention
    mask for a name its AttentionMaskInterface does not know, so none is computed."""
    from transformers import AttentionInterface

    AttentionInterface.register(PAGED_ATTENTION, paged_attention_forward)


class PagedTransformersCausalLM(TransformersCausalLM):
    """TransformersCausalLM whose attention reads and writes a paged KV cache with opperf's paged kernels.

    The steps a cache serves are fixed when it is made: prefill at each of `prefill_lengths` (batch
    `prefill_batch`, one shared empty cache) and `decode_steps` decode steps after a written context."""

    def __init__(self, config: dict, device: str, dtype: torch.dtype, seed: int = 0, path: str | Path = "", *,
                 prefill_batch: int = 1, prefill_lengths: tuple[int, ...] = (), decode_steps: int = 0,
                 experts: str | None = None):
        register_paged_attention()
        super().__init__(config, device, dtype, seed=seed, path=path, attention=PAGED_ATTENTION, experts=experts)
        self.description["kv_cache"] = dict(KV_CACHE_NOTE)
        self.decode_steps = decode_steps
        self.layer_shapes = self._probe(path)
        self._prefill_cache = (PagedKVCache(self.layer_shapes, prefill_batch,
                                            [(0, length) for length in prefill_lengths], device)
                               if prefill_lengths else None)

    @torch.inference_mode()
    def _probe(self, path) -> list[LayerShape]:
        """Each layer's cache shape, from a one-token forward; every decoder layer must attend through the
        attention interface (a recurrent or hand-written attention layer would keep state nobody pages)."""
        name, text_config = type(self.model).__name__, self.config.get_text_config()
        other_types = sorted(set(getattr(text_config, "layer_types", None) or ()) - PAGED_LAYER_TYPES)
        if other_types:
            raise OpperfError(f"{name}: its {', '.join(other_types)} layers are not the full or sliding-window "
                              f"attention paged attention computes; {UNPAGED}", path=path or None)
        probe = ShapeProbe()
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        # With its cache this once: what the model keeps besides attention keys and values shows in it.
        try:
            output = self.model(input_ids=ids, position_ids=torch.zeros_like(ids), use_cache=True,
                                logits_to_keep=1, paged_kv_cache=probe)
        except OpperfError as exc:                  # the attention function's refusal, said of the config
            raise OpperfError(exc.reason, path=path or None) from exc
        cache = getattr(output, "past_key_values", None)
        cache = cache if cache is not None else getattr(output, "cache_params", None)    # Mamba2 before 5.24
        kept = {type(cache).__name__} - {"DynamicCache", "NoneType"} | {
            type(layer).__name__ for layer in getattr(cache, "layers", ())} - set(PAGED_CACHE_LAYERS)
        if kept:
            raise OpperfError(f"{name} keeps state a paged KV cache does not hold ({', '.join(sorted(kept))}); "
                              f"{UNPAGED}", path=path or None)
        layers = int(getattr(text_config, "num_hidden_layers", 0) or 0)
        missing = sorted(set(range(layers)) - set(probe.layers))
        if missing or not probe.layers:
            raise OpperfError(f"{name}: decoder layers {missing or list(range(layers))} do not run their attention "
                              f"through transformers' AttentionInterface, so they cannot attend over a paged KV "
                              f"cache; {UNPAGED}", path=path or None)
        return [probe.layers[index] for index in range(layers)]

    def new_cache(self) -> PagedKVCache:
        if self._prefill_cache is None:
            raise OpperfError("this paged model was made without prefill_lengths, so it has no prefill cache")
        return self._prefill_cache

    @torch.inference_mode()
    def written_cache(self, batch: int, context: int, generator: torch.Generator | None = None) -> WrittenCache:
        """A paged cache of `batch` sequences whose first `context` positions hold random keys and values, for
        `decode_steps` decode steps after them."""
        if self.decode_steps < 1:
            raise OpperfError("this paged model was made with decode_steps 0, so it has no decode cache")
        steps = [(context + step, 1) for step in range(self.decode_steps)]
        generator = generator if generator is not None else torch.Generator(device=self.device).manual_seed(0)
        cache = PagedKVCache(self.layer_shapes, batch, steps, self.device, generator)
        return WrittenCache(cache, f"{WRITTEN_CONTEXT} in a paged cache of {BLOCK_SIZE}-token blocks "
                                   "([2, blocks, block_size, kv_heads, head_dim] a layer; each sequence's blocks in "
                                   "turn)")

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, start_position: int, cache: PagedKVCache):
        """One step of `token_ids` [batch, tokens] after `start_position` cached tokens; logits of the last
        position only. The model keeps no cache of its own (use_cache=False): the paged cache is written in place."""
        step = cache.step(*token_ids.shape[:1], start_position, token_ids.shape[1])
        output = self.model(input_ids=token_ids, position_ids=step.position_ids, use_cache=False, logits_to_keep=1,
                            paged_kv_cache=cache, paged_step=step)
        return output.logits, cache
