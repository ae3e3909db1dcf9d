"""MoE kernels: grouped matmul, token permute/unpermute, gating top-k and DispatchFFNCombine.

Expert layouts come from `model.experts`: (EP size, experts per rank E, top-k K, hidden H, expert
intermediate I) per target model and EP size; gating from `model.gating`: (routed experts, K). Token
counts T sweep MOE_TOKENS_GRID. Experts run with expert parallelism, unsharded by TP.

- grouped_matmul (torch_npu.npu_grouped_matmul, split by group_list; 9 input slots
  x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, group_list, per_token_scale):
  gate/up  x (T,H), weight (E,H,2I), group_list (E,) → (T,2I);  down  x (T,I), weight (E,I,H) → (T,H).
- token_permute:   tokens (T,H), indices (T,K) → permuted (T*K,H), sorted indices (T*K,).
- token_unpermute: permuted (T*K,H), sorted indices (T*K,), probs (T,K) → (T,H).
- gating_top_k:    logits (T,experts), bias (experts,) → weights (T,K), expert ids (T,K), scores (T,experts).
- gating_top_k_softmax: logits (T,experts) → weights (T,K), expert ids (T,K), row ids (T,K).
- dispatch_ffn_combine (one rank of the fused dispatch → FFN → combine, W8A8; N = 2I):
  x (T,H), weight1 (E,H,N), weight2 (E,N/2,H), expert ids (T,K), scale1 (E*N,) or (E,N), scale2 (E*H,) or
  (E,H) (param scale_layout), probs (T,K) → (T,H) [, (E,) token counts]; the `EP Size` column carries the EP
  size (part of the row signature).

Density: every expert layout is a bucket sweeping T. Gating also sweeps the standard's exact experts and
top-k values (`moe_gating_topk.experts`, `.topk`) together with the target models' own, as one bucket.
"""

from __future__ import annotations

from collections.abc import Iterator

from opperf.contract import EP_SIZE
from opperf.grid.candidate import Candidate
from opperf.grid.generators.base import INT, Generator, ParamSpec
from opperf.grid.values import ValueGrids

KERNELS = ("grouped_matmul", "token_permute", "token_unpermute", "gating_top_k", "gating_top_k_softmax",
           "dispatch_ffn_combine")
_GROUPED_MATMUL_SLOTS = 9
_GROUP_LIST_SLOT = 7
TOKENS_AXIS, EXPERTS_AXIS, TOP_K_AXIS = "MOE_TOKENS_GRID", "moe_gating_topk.experts", "moe_gating_topk.topk"


def _experts(grids: ValueGrids, kernel: str):
    return grids.values("model.experts", field=f"generator moe ({kernel})")


def _grouped_matmul(tokens, experts, weight_in, weight_out):
    inputs = [None] * _GROUPED_MATMUL_SLOTS
    inputs[0], inputs[1], inputs[_GROUP_LIST_SLOT] = (tokens, weight_in), (experts, weight_in, weight_out), (experts,)
    return Candidate(tuple(inputs), ((tokens, weight_out),))


def _placed(candidate: Candidate, group, axes, users) -> Candidate:
    return Candidate(candidate.inputs, candidate.outputs, candidate.columns, group, axes, users)


def _gating(kernel: str, grids: ValueGrids, tokens_grid: list[int]) -> Iterator[Candidate]:
    where = f"generator moe ({kernel})"
    model_pairs = grids.values("model.gating", field=where)
    experts_grid = sorted(set(grids.values(EXPERTS_AXIS, field=where)) | {e for e, _ in model_pairs})
    top_k_grid = sorted(set(grids.values(TOP_K_AXIS, field=where)) | {k for _, k in model_pairs})
    users = [grids.users("model.gating", pair) for pair in model_pairs]
    group_users = frozenset().union(*[u for u in users if u]) if any(users) else None
    for routed in experts_grid:
        for top_k in top_k_grid:
            for t in tokens_grid:
                axes = (("experts", EXPERTS_AXIS, routed), ("top_k", TOP_K_AXIS, top_k), ("t", TOKENS_AXIS, t))
                if kernel == "gating_top_k":
                    candidate = Candidate(((t, routed), (routed,)), ((t, top_k), (t, top_k), (t, routed)))
                else:
                    candidate = Candidate(((t, routed),), ((t, top_k), (t, top_k), (t, top_k)))
                yield _placed(candidate, (), axes, group_users)


def moe(params: dict, grids: ValueGrids) -> Iterator[Candidate]:
    kernel = params["kernel"]
    tokens_grid = grids.values(TOKENS_AXIS, field=f"generator moe ({kernel})")
    if kernel in ("gating_top_k", "gating_top_k_softmax"):
        yield from _gating(kernel, grids, tokens_grid)
        return
    for layout in _experts(grids, kernel):
        ep, experts, top_k, hidden, width = layout
        users = grids.users("model.experts", layout)
        group = (("ep", ep), ("experts", experts), ("top_k", top_k), ("hidden", hidden), ("width", width))
        for t in tokens_grid:
            axes = (("t", TOKENS_AXIS, t),)
            if kernel == "grouped_matmul":
                yield _placed(_grouped_matmul(t, experts, hidden, 2 * width), group + (("proj", "gate_up"),), axes,
                              users)
                yield _placed(_grouped_matmul(t, experts, width, hidden), group + (("proj", "down"),), axes, users)
            elif kernel == "token_permute":
                yield _placed(Candidate(((t, hidden), (t, top_k)), ((t * top_k, hidden), (t * top_k,))), group,
                              axes, users)
            elif kernel == "token_unpermute":
                yield _placed(Candidate(((t * top_k, hidden), (t * top_k,), (t, top_k)), ((t, hidden),)), group,
                              axes, users)
            elif kernel == "dispatch_ffn_combine":
                if experts > params["max_experts_per_rank"]:
                    continue
                n = 2 * width
                if params["scale_layout"] == "flat":
                    scale1, scale2 = (experts * n,), (experts * hidden,)
                else:
                    scale1, scale2 = (experts, n), (experts, hidden)
                inputs = ((t, hidden), (experts, hidden, n), (experts, width, hidden), (t, top_k), scale1, scale2,
                          (t, top_k))
                # Profiles show the output with or without the per-expert token counts: offer both, each
                # lands only on the profiled rows of its own structure.
                for outputs in (((t, hidden), (experts,)), ((t, hidden),)):
                    yield _placed(Candidate(inputs, outputs, ((EP_SIZE, str(ep)),)),
                                  group + (("outputs", len(outputs)),), axes, users)


GENERATORS = [
    Generator("moe", {
        "kernel": ParamSpec(KERNELS, "grouped_matmul"),
        # DispatchFFNCombine's documented limit on experts per rank; layouts above it are skipped.
        "max_experts_per_rank": ParamSpec(INT, 16),
        # DispatchFFNCombine's dequantisation scales: flat (E*N,), (E*H,) or per expert (E,N), (E,H).
        "scale_layout": ParamSpec(("flat", "per_expert"), "flat"),
    }, moe),
]
