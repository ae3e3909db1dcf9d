"""A Llama-style reference decoder built from plain torch ops, so the profiler sees the ops a serving stack runs.

RMSNorm, QKV/O projections, rotary embeddings, grouped-query attention over a KV cache, SwiGLU MLP (or,
for a model with `num_experts`, a routed mixture of SwiGLU experts) and residual adds, with random
weights and the dimensions of a model in `config/models.yaml`. Nothing here is fused or clever on
purpose: each step should appear in the profile as the kernels a real model's eager path launches.

The MoE block is the eager Hugging Face/vLLM-reference shape: router projection, softmax, top-k,
renormalised weights; tokens sorted by expert (argsort), each expert's SwiGLU on its contiguous slice
(one matmul per expert with as many rows as tokens were routed to it), weighted and scattered back with
index_add_. The per-expert token counts are read once per layer (one host sync), as eager MoE code does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from opperf.errors import OpperfError
from opperf.model_names import model_key, read_models
from opperf.yaml_files import field_error

_REQUIRED_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                    "vocab_size", "num_hidden_layers")


@dataclass(frozen=True)
class DecoderDims:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_hidden_layers: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    num_experts: int = 0                   # 0: a dense SwiGLU MLP
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def load_model_dims(models_path: str | Path, name: str, num_layers: int | None = None) -> DecoderDims:
    """The decoder dimensions of model `name` from config/models.yaml (Hugging Face field names).

    `num_layers` overrides the depth (a few layers measure the same kernels as the whole model)."""
    models_path = Path(models_path)
    models = read_models(models_path)
    key = model_key(models, name, path=models_path, field="--model")
    entry = models[key]
    missing = [f for f in _REQUIRED_FIELDS if f not in entry]
    if missing:
        raise field_error(f"model {key!r} lacks {missing} (the workload builds every layer from them)",
                          models_path, f"{key}.{missing[0]}")
    head_dim = int(entry.get("head_dim") or entry["hidden_size"] // entry["num_attention_heads"])
    if entry["num_attention_heads"] % entry["num_key_value_heads"]:
        raise field_error(f"model {key!r}: num_attention_heads must be a multiple of num_key_value_heads",
                          models_path, f"{key}.num_key_value_heads")
    experts = int(entry.get("num_experts") or entry.get("n_routed_experts") or 0)
    if experts and not (entry.get("num_experts_per_tok") and entry.get("moe_intermediate_size")):
        raise field_error(f"model {key!r} has experts but lacks num_experts_per_tok / moe_intermediate_size",
                          models_path, f"{key}.num_experts_per_tok")
    if num_layers is not None and num_layers < 1:
        raise OpperfError(f"must be >= 1, got {num_layers}", field="--num-layers")
    return DecoderDims(hidden_size=int(entry["hidden_size"]), intermediate_size=int(entry["intermediate_size"]),
                       num_attention_heads=int(entry["num_attention_heads"]),
                       num_key_value_heads=int(entry["num_key_value_heads"]), head_dim=head_dim,
                       vocab_size=int(entry["vocab_size"]),
                       num_hidden_layers=int(num_layers or entry["num_hidden_layers"]),
                       rms_norm_eps=float(entry.get("rms_norm_eps", 1e-6)),
                       rope_theta=float(entry.get("rope_theta", 10000.0)), num_experts=experts,
                       num_experts_per_tok=int(entry.get("num_experts_per_tok") or 0) if experts else 0,
                       moe_intermediate_size=int(entry.get("moe_intermediate_size") or 0) if experts else 0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(dims: DecoderDims, max_positions: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (dims.rope_theta ** (torch.arange(0, dims.head_dim, 2, device=device).float() / dims.head_dim))
    positions = torch.arange(max_positions, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


WRITTEN_CONTEXT = "written before the profile, not computed: decode_context tokens of random keys and values"


class WrittenCache:
    """A decode batch's KV cache as written before the profile (the model's `written_cache`) and `how` it was made
    (workload.json's `decode_cache`): `decoding()` hands it over holding the decode context, however many decode
    steps ran over it before. The reference decoder's steps return a new cache and leave this one as it is."""

    def __init__(self, cache, how: str = WRITTEN_CONTEXT):
        self.cache = cache
        self.how = how

    @contextlib.contextmanager
    def decoding(self) -> Iterator:
        yield self.cache


def random_state(shape: tuple[int, ...], dtype: torch.dtype, device, generator: torch.Generator | None
                 ) -> torch.Tensor:
    """A cache tensor written, not computed: normal values from `generator` (a cache's values change no kernel of a
    decode step, but uninitialised memory may hold NaNs or denormals, which slow a CPU down), or, without one (on
    meta), shape alone."""
    if generator is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.randn(shape, generator=generator, dtype=dtype, device=device)


class ReferenceDecoder:
    """Embedding → N × (attention + MLP) decoder layers → final norm → lm_head, with a KV cache."""

    def __init__(self, dims: DecoderDims, device: str, dtype: torch.dtype, seed: int = 0):
        # Weights are drawn on the device: a MoE layer holds gigabytes of them. On "meta" (recording the
        # queries a performance model issues, opperf.consumer.queries) they hold no memory at all.
        self.dims, self.device, self.dtype = dims, device, dtype
        self.scaled_dot_product_attention = F.scaled_dot_product_attention
        generator = None if device == "meta" else torch.Generator(device=device).manual_seed(seed)

        def weight(*shape):
            if generator is None:
                return torch.empty(*shape, device=device, dtype=dtype)
            values = torch.randn(*shape, generator=generator, device=device) * shape[-1] ** -0.5
            return values.to(dtype=dtype)

        q_size = dims.num_attention_heads * dims.head_dim
        kv_size = dims.num_key_value_heads * dims.head_dim
        self.embedding = weight(dims.vocab_size, dims.hidden_size)
        self.layers = [{
            "input_norm": torch.ones(dims.hidden_size, device=device, dtype=dtype),
            "qkv": weight(q_size + 2 * kv_size, dims.hidden_size),
            "o": weight(dims.hidden_size, q_size),
            "post_norm": torch.ones(dims.hidden_size, device=device, dtype=dtype),
            **(self._moe_weights(weight) if dims.is_moe else {
                "gate_up": weight(2 * dims.intermediate_size, dims.hidden_size),
                "down": weight(dims.hidden_size, dims.intermediate_size)}),
        } for _ in range(dims.num_hidden_layers)]
        self.final_norm = torch.ones(dims.hidden_size, device=device, dtype=dtype)
        self.lm_head = weight(dims.vocab_size, dims.hidden_size)

    def new_cache(self) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
        return [None] * self.dims.num_hidden_layers

    def written_cache(self, batch: int, context: int, generator: torch.Generator | None = None) -> WrittenCache:
        """The KV cache of `batch` sequences holding `context` tokens, written (random keys and values, each layer its
        own) instead of computed by a prefill of the context. They are laid out as `_attention` leaves a prefill's:
        the keys (rotated) token-major, the values a view of the QKV projection's output, so the first decode step's
        `cat` reads the strides it read after a prefill."""
        dims = self.dims
        q_size = dims.num_attention_heads * dims.head_dim
        kv_size = dims.num_key_value_heads * dims.head_dim
        cache = []
        for _ in range(dims.num_hidden_layers):
            keys = random_state((batch, context, dims.num_key_value_heads, dims.head_dim), self.dtype, self.device,
                                generator)
            qkv = random_state((batch, context, q_size + 2 * kv_size), self.dtype, self.device, generator)
            values = qkv[..., q_size + kv_size:].view(batch, context, dims.num_key_value_heads, dims.head_dim)
            cache.append((keys.transpose(1, 2), values.transpose(1, 2)))
        return WrittenCache(cache)

    def _attention(self, layer, x, cos, sin, cache):
        dims = self.dims
        batch, tokens, _ = x.shape
        q_size = dims.num_attention_heads * dims.head_dim
        kv_size = dims.num_key_value_heads * dims.head_dim
        qkv = F.linear(x, layer["qkv"])
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(batch, tokens, dims.num_attention_heads, dims.head_dim).transpose(1, 2)
        k = k.view(batch, tokens, dims.num_key_value_heads, dims.head_dim).transpose(1, 2)
        v = v.view(batch, tokens, dims.num_key_value_heads, dims.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if cache is not None:
            k = torch.cat((cache[0], k), dim=2)
            v = torch.cat((cache[1], v), dim=2)
        new_cache = (k, v)
        groups = dims.num_attention_heads // dims.num_key_value_heads
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        out = self.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        out = out.transpose(1, 2).reshape(batch, tokens, q_size)
        return F.linear(out, layer["o"]), new_cache

    def _moe_weights(self, weight) -> dict:
        dims = self.dims
        return {"router": weight(dims.num_experts, dims.hidden_size),
                "experts_gate_up": weight(dims.num_experts, 2 * dims.moe_intermediate_size, dims.hidden_size),
                "experts_down": weight(dims.num_experts, dims.hidden_size, dims.moe_intermediate_size)}

    def _mlp(self, layer, x):
        if self.dims.is_moe:
            return self._moe(layer, x)
        gate, up = F.linear(x, layer["gate_up"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, layer["down"])

    def _expert_token_counts(self, experts: torch.Tensor) -> list[int]:
        """Tokens routed to each expert; on "meta" (no values) the balanced split a router aims for."""
        experts_total = self.dims.num_experts
        if experts.device.type == "meta":
            base, extra = divmod(experts.numel(), experts_total)
            return [base + (expert < extra) for expert in range(experts_total)]
        return torch.bincount(experts.reshape(-1), minlength=experts_total).tolist()

    def _moe(self, layer, x):
        dims = self.dims
        top_k = dims.num_experts_per_tok
        hidden = x.reshape(-1, dims.hidden_size)
        probabilities = F.softmax(F.linear(hidden, layer["router"]), dim=-1, dtype=torch.float32)
        weights, experts = torch.topk(probabilities, top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        order = experts.reshape(-1).argsort()
        counts = self._expert_token_counts(experts)
        tokens = order // top_k
        routed = hidden.index_select(0, tokens)
        outputs, start = [], 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            gate, up = F.linear(routed[start:start + count], layer["experts_gate_up"][expert]).chunk(2, dim=-1)
            outputs.append(F.linear(F.silu(gate) * up, layer["experts_down"][expert]))
            start += count
        weighted = torch.cat(outputs) * weights.reshape(-1).index_select(0, order)[:, None]
        return torch.zeros_like(hidden).index_add_(0, tokens, weighted).reshape(x.shape)

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, start_position: int, cache):
        """One prefill (start_position 0, no cache) or decode step; returns logits and the new cache."""
        return self.step(token_ids, start_position, cache)

    def step(self, token_ids: torch.Tensor, start_position: int, cache):
        """`forward` without inference mode: under it torch hands composite ops (linear, SDPA) to a dispatch
        mode undecomposed, which is not what a performance model running under no_grad records."""
        dims = self.dims
        tokens = token_ids.shape[1]
        x = F.embedding(token_ids, self.embedding)
        cos_all, sin_all = self._rope
        cos = cos_all[start_position:start_position + tokens][None, None]
        sin = sin_all[start_position:start_position + tokens][None, None]
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache):
            attn, kv = self._attention(layer, rms_norm(x, layer["input_norm"], dims.rms_norm_eps), cos, sin,
                                       layer_cache)
            x = x + attn
            x = x + self._mlp(layer, rms_norm(x, layer["post_norm"], dims.rms_norm_eps))
            new_cache.append(kv)
        x = rms_norm(x, self.final_norm, dims.rms_norm_eps)
        return F.linear(x[:, -1:], self.lm_head), new_cache

    def prepare_rope(self, max_positions: int) -> None:
        self._rope = rope_tables(self.dims, max_positions, self.device, self.dtype)
