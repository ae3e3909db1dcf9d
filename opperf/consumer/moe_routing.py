"""TensorCast's MoE routing ops computed for real, so their recorded queries can be replayed and timed.

msmodeling's builtin MoE models (glm4_moe, ernie4_5_moe, qwen3_moe, deepseek_v3, …) route tokens with three ops
that are shape-only placeholders there (schemas and docstrings: msmodeling's `tensor_cast/ops/fused_moe.py`; their
use: `tensor_cast/layers/moe_layer.py`). These are the computations they stand for, in torch alone so they run on
cpu and cuda:

- `moe_gating_top_k_softmax(x [.., E], k)`: the softmax over the experts, then the k largest probabilities and
  their expert ids (weights in x's dtype, ids int64; not renormalised: the layer divides by their sum itself).
- `init_routing_v2(x [.., T, H], topk_indices [.., k])`: each token repeated k times and the T*k copies put in
  expert order, [T*k, H]: copy j of token t (flat position t*k + j) sorted by its expert id, stably (ties keep
  token order, as a grouped matmul's contiguous per-expert rows need).
- `unpermute_tokens(x [T*k, H], topk_indices)`: the inverse, back to [*topk_indices.shape, H], row i of `x`
  returning to the flat position it was taken from. The op gets the expert ids only, so it sorts them again.

Kernels chosen by measurement (torch 2.13 CPU, one thread, the 2-core EPYC VM under other load: best of 15 calls in
3 interleaved rounds; us; H 64 / E 8 / k 2 and H 4096 / E 128 / k 8 (GLM-4.5-Air), bfloat16 tokens, ids balanced):

    case                    permute                       unpermute                                  gating
                            argsort(stable)  key sort     index_copy_  inverse+gather  argsort²      softmax+topk  topk+lse
    H64 E8 T4                    13             19             7            16            14               4          16
    H64 E8 T512                  29             25            36            21            36              77          48
    H64 E8 T4096                167            359           316           129           310             688         325
    H4096 E128 T4                11             14            44            13            12               3          12
    H4096 E128 T64               75             77           602            96            96              18          29
    H4096 E128 T2048          71100          73718         87884         76410         77222            2501        2640

- permute: `argsort(ids, stable=True)` then one `index_select` of the tokens (a unique key `id * n + position`
  under an unstable sort is no faster); unpermute: the inverse permutation by one scatter, then one
  `index_select` (gathering rows beats `index_copy_`'s scattered writes up to 6x at 64 tokens); gating: `softmax`
  then `topk` (taking the top k of the logits first and normalising by `logsumexp` wins only at 8 experts and
  hundreds of tokens; real MoEs route over 64 or more). Large calls are bound by copying the rows either way.
"""

from __future__ import annotations

import torch

# The experts a permute / unpermute row's ids route over: its calls' shapes do not carry the count (the gating's
# logits width does), and balanced ids need it.
RUNTIME_NUM_EXPERTS = "Runtime num_experts"


def moe_gating_top_k_softmax(x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, expert ids) of the `top_k` most probable experts per token, from router logits `x` [.., E]."""
    weights, expert_ids = torch.topk(torch.softmax(x, dim=-1), top_k, dim=-1)
    return weights, expert_ids


def _expert_order(topk_indices: torch.Tensor) -> torch.Tensor:
    return torch.argsort(topk_indices.reshape(-1), stable=True)


def init_routing_v2(x: torch.Tensor, topk_indices: torch.Tensor) -> torch.Tensor:
    """The tokens of `x` [.., T, H], each repeated top-k times, in the order of their experts: [T*k, H]."""
    top_k = topk_indices.shape[-1]
    return x.reshape(-1, x.shape[-1]).index_select(0, _expert_order(topk_indices) // top_k)


def unpermute_tokens(x: torch.Tensor, topk_indices: torch.Tensor) -> torch.Tensor:
    """`init_routing_v2`'s rows `x` [T*k, H] back in token order: [*topk_indices.shape, H]."""
    order = _expert_order(topk_indices)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return x.index_select(0, inverse).view(*topk_indices.shape, x.shape[-1])


def balanced_expert_ids(tokens: int, top_k: int, experts: int, *, seed: int = 0,
                        device: str | torch.device = "cpu") -> torch.Tensor:
    """Expert ids [tokens, top_k] (int64) as a router aims to route: every expert gets tokens * top_k / experts
    copies (one more for the first remainder experts), a token's k experts distinct, in seeded random order.

    Copy c of the T*k goes to expert c mod E (so any k consecutive copies, one token's, differ), then the experts'
    labels, the tokens and each token's k slots are shuffled: the counts and distinctness stay, the pattern goes."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top_k {top_k} must be between 1 and the {experts} experts")
    generator = torch.Generator().manual_seed(seed)
    ids = (torch.arange(tokens * top_k) % experts).view(tokens, top_k)
    ids = torch.randperm(experts, generator=generator)[ids][torch.randperm(tokens, generator=generator)]
    ids = ids.gather(1, torch.rand(tokens, top_k, generator=generator).argsort(dim=1))
    return ids.to(device)
