"""Balanced expert routing for a transformers MoE model's profiled steps.

A model built from its config has random weights, and its router's scores follow what the hidden states of a
step's tokens share more than what tells them apart: the tokens pile onto a few experts. On the H200,
ERNIE-4.5-21B-A3B's decode step of 12 tokens (2 layers) ran 6 of its 64 experts, each with all 12 tokens, so the
measured step read a tenth of the expert weights a served step reads; tiny glm4_moe and ernie4_5_moe configs on the
CPU route 12 tokens x top-2 over 8 experts as 1/6/2/3/1/2/1/8 and 4/6/0/0/0/1/1/12. A trained router spreads
tokens over the experts, as msmodeling's MoE layer assumes (it splits the tokens x top_k copies evenly:
`get_split_sizes`).

`balance_routing` hooks each router so its expert ids are `opperf.consumer.moe_routing.balanced_expert_ids`: every
expert gets tokens x top_k / experts copies (one more for the first remainder), a token's k experts distinct. The
router still runs (its GEMM, softmax or sigmoid and top-k stay in the step); only the ids it returns change, and the
weights it returns stay its own. The ids of each token count are made once, on the first call (the profile's
warm-up), and reused, so the profiled passes run no extra kernel for them.
"""

from __future__ import annotations

import torch

from opperf.consumer.moe_routing import balanced_expert_ids
from opperf.errors import OpperfError

ROUTINGS = ("model", "balanced")      # the model's own router's ids, or balanced ones


def routers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's MoE routers: modules of a `…Router` class with `top_k` and `num_experts` (transformers' MoE
    routers return (logits, weights, expert ids))."""
    return [(name, module) for name, module in model.named_modules()
            if type(module).__name__.lower().endswith("router") and hasattr(module, "top_k")
            and hasattr(module, "num_experts")]


def balance_routing(model: torch.nn.Module) -> dict:
    """Hook every router of `model` to return balanced expert ids; what was hooked ({routers, experts, top_k}).
    A model without routers, or a router that does not return (logits, weights, ids [tokens, top_k]), is an
    error naming it."""
    found = routers(model)
    if not found:
        raise OpperfError(f"{type(model).__name__} has no MoE router (a module of a …Router class with top_k and "
                          "num_experts) to balance", field="--routing")
    widths = set()
    for name, router in found:
        top_k, experts = int(router.top_k), int(router.num_experts)
        widths.add((top_k, experts))
        made: dict[tuple[int, str], torch.Tensor] = {}

        def balanced(module, inputs, output, name=name, top_k=top_k, experts=experts, made=made):
            if not (isinstance(output, tuple) and len(output) == 3 and isinstance(output[2], torch.Tensor)
                    and not output[2].is_floating_point() and output[2].dim() == 2 and output[2].shape[1] == top_k):
                raise OpperfError(f"router {name} ({type(module).__name__}) does not return (logits, weights, "
                                  f"expert ids [tokens, {top_k}]): its routing cannot be balanced", field="--routing")
            ids = output[2]
            key = (ids.shape[0], str(ids.device))
            if key not in made:
                made[key] = balanced_expert_ids(ids.shape[0], top_k, experts, device=ids.device).to(ids.dtype)
            return output[0], output[1], made[key]

        router.register_forward_hook(balanced)
    return {"routing": "balanced", "routers": len(found),
            "experts_top_k": [{"experts": e, "top_k": k} for k, e in sorted(widths)]}
