"""A transformers MoE model's experts run as msmodeling's MoE layer runs them: the step its runner predicts.

msmodeling (TensorCast) replaces a model's experts with its own layer (`tensor_cast/layers/moe_layer.py`, one
device: EP 1, TP 1) and its fused 3-D expert weights with one MLP per expert (`MoeExpertMLP`). Its graph for a
layer of T tokens routed to k of E experts, as its chrome trace lists it:

    init_routing_v2(x, ids)                    the T*k copies in expert order        [T*k, H]
    split by expert; cat([block]) per expert   rearrange_token_by_expert (one device)
    cat(blocks); split_with_sizes
    per expert with rows: mm gate, mm up, silu(gate), up * ., mm down     (an empty block is skipped)
    cat(outputs)                               rearrange_token_by_device
    unpermute_tokens(., ids)                   back in token order                   [T, k, H]
    (. * weights[..., None]).sum(-2)

transformers' own implementations run other graphs: grouped_mm two grouped GEMMs over all experts, eager a loop
with a host sync, a gather and an index_add per expert. Registered as the experts implementation `tensor_cast`
(`--experts-implementation tensor_cast`), this one runs msmodeling's graph on the model's real weights with the
kernels opperf's replay times the routing ops with (`opperf.consumer.moe_routing`), so the measured step and
msmodeling's prediction are the same ops; what the model's own grouped_mm step differs by is msmodeling's graph.

The per-expert block sizes need the ids' counts on the host. They are counted once per ids tensor: with
`--routing balanced` the router returns the same ids for every step of a token count, so the profiled passes run
no counting kernel and no sync (a model's own routing counts every step).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from opperf.consumer.moe_routing import init_routing_v2, unpermute_tokens
from opperf.errors import OpperfError

NAME = "tensor_cast"
# record_function ranges around the routing ops, named as msmodeling's trace names them, so a profile's kernels of
# each pair with its answer (benchmarks/e2e_prediction.py OP_PAIRS)
PERMUTE_RANGE, UNPERMUTE_RANGE = "tensor_cast.init_routing_v2", "tensor_cast.unpermute_tokens"

# ids tensor → its per-expert counts (held weakly: the balanced routing keeps its ids alive, a model's own ids go)
_COUNTS = WeakIdKeyDictionary()


def expert_counts(top_k_index: torch.Tensor, experts: int) -> list[int]:
    """Copies per expert (in expert id order, as init_routing_v2 sorts them), counted once per ids tensor."""
    counts = _COUNTS.get(top_k_index)
    if counts is None or len(counts) != experts:
        counts = torch.bincount(top_k_index.reshape(-1), minlength=experts).tolist()
        _COUNTS[top_k_index] = counts
    return counts


def _expert_weights(module: torch.nn.Module, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(gate, up, down) of one expert as F.linear weights ([out, in]), views of the fused 3-D parameters."""
    gate_up, down = module.gate_up_proj[expert], module.down_proj[expert]
    if getattr(module, "is_transposed", False):          # stored [in, out]
        gate_up, down = gate_up.t(), down.t()
    gate, up = gate_up.chunk(2, dim=0)
    return gate, up, down


def tensor_cast_experts_forward(self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output [T, H] for `hidden_states` [T, H] routed by `top_k_index` / `top_k_weights` [T, k],
    computed by msmodeling's MoE layer's graph (module docstring)."""
    if not getattr(self, "has_gate", True) or getattr(self, "has_bias", False) \
            or not getattr(self, "is_concatenated", True) or getattr(self, "has_post_expert_norm", False):
        raise OpperfError(f"{type(self).__name__}: the tensor_cast experts implementation runs msmodeling's gated "
                          "MLP experts (gate and up concatenated, no bias, no post-expert norm); this model's "
                          "experts differ", field="--experts-implementation")
    experts = int(self.num_experts)
    counts = expert_counts(top_k_index, experts)
    with torch.profiler.record_function(PERMUTE_RANGE):
        permuted = init_routing_v2(hidden_states, top_k_index)
    blocks = [torch.cat([block]) for block in permuted.split(counts)]
    blocks = torch.cat(blocks).split_with_sizes(counts)
    outputs = []
    for expert, block in enumerate(blocks):
        if block.numel() == 0:
            outputs.append(block)                        # msmodeling's call_expert returns an empty block as is
            continue
        gate_weight, up_weight, down_weight = _expert_weights(self, expert)
        gate, up = F.linear(block, gate_weight), F.linear(block, up_weight)
        outputs.append(F.linear(up * self.act_fn(gate), down_weight))
    combined = torch.cat(outputs)
    with torch.profiler.record_function(UNPERMUTE_RANGE):
        combined = unpermute_tokens(combined, top_k_index)
    return (combined * top_k_weights.unsqueeze(-1)).sum(dim=-2).to(hidden_states.dtype)


def register() -> None:
    """Make `tensor_cast` an experts implementation transformers accepts (idempotent)."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    if NAME not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(NAME, tensor_cast_experts_forward)
