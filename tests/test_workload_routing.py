"""Balanced routing of a transformers MoE model's profiled steps (opperf.workload.routing): every expert gets an
even share of the tokens x top_k copies, a token's experts are distinct, the router itself still runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from opperf.errors import OpperfError
from opperf.workload.routing import balance_routing, routers
from opperf.workload.transformers_model import TransformersCausalLM

WORKLOADS = Path(__file__).parent / "data" / "workload"


def _model(name: str) -> TransformersCausalLM:
    return TransformersCausalLM(json.loads((WORKLOADS / f"{name}.json").read_text()), "cpu", torch.bfloat16,
                                experts="eager")


def _expert_ids(model: TransformersCausalLM, tokens: int) -> list[torch.Tensor]:
    """The expert ids each MoE layer's experts got for one forward of `tokens` tokens (the tensors themselves)."""
    seen = []
    hooks = [module.register_forward_pre_hook(lambda module, args: seen.append(args[1]))
             for name, module in model.model.named_modules() if name.endswith("mlp.experts")]
    model.model(torch.randint(0, model.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0)))
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("name", ["tiny_glm4_moe", "tiny_ernie4_5_moe"])
def test_balanced_routing_gives_every_expert_an_even_share_of_each_steps_tokens(name):
    model = _model(name)
    assert model.description["experts_implementation"] == "eager"      # a loop over the experts, as asked
    # the random model's own router piles the tokens onto a few experts
    assert max(torch.bincount(_expert_ids(model, 12)[0].reshape(-1), minlength=8).tolist()) >= 6
    assert balance_routing(model.model) == {"routing": "balanced", "routers": 2,
                                            "experts_top_k": [{"experts": 8, "top_k": 2}]}
    for tokens, shares in ((12, [3] * 8), (5, [2, 2, 1, 1, 1, 1, 1, 1])):
        for ids in _expert_ids(model, tokens):
            assert ids.shape == (tokens, 2) and ids.dtype == torch.int64
            assert sorted(torch.bincount(ids.reshape(-1), minlength=8).tolist(), reverse=True) == shares
            assert all(len(set(row)) == 2 for row in ids.tolist())       # a token's experts differ
    # made once per token count: the next forward of 12 tokens gets the very same tensor (no kernel of its own)
    assert _expert_ids(model, 12)[0] is _expert_ids(model, 12)[0]


def test_a_model_without_routers_is_refused_naming_the_option():
    dense = TransformersCausalLM(json.loads((WORKLOADS / "tiny_mistral.json").read_text()), "cpu", torch.float32)
    assert routers(dense.model) == []
    with pytest.raises(OpperfError, match="MistralForCausalLM has no MoE router") as error:
        balance_routing(dense.model)
    assert error.value.field == "--routing"
