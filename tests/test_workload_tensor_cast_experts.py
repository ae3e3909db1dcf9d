"""A transformers MoE model's experts run as msmodeling's MoE layer runs them (opperf.workload.tensor_cast_experts):
the same output as transformers' own implementations, and msmodeling's graph: per expert with tokens three GEMMs, a
silu and a mul, a one-block cat per expert and two joining cats, the routing ops in ranges named as its trace
names them."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opperf.errors import OpperfError
from opperf.workload import tensor_cast_experts
from opperf.workload.routing import balance_routing
from opperf.workload.transformers_model import TransformersCausalLM

WORKLOADS = Path(__file__).parent / "data" / "workload"


def _model(name: str, experts: str) -> TransformersCausalLM:
    return TransformersCausalLM(json.loads((WORKLOADS / f"{name}.json").read_text()), "cpu", torch.float32,
                                seed=0, experts=experts)


def _logits(model: TransformersCausalLM, tokens: int) -> torch.Tensor:
    ids = torch.randint(0, model.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1))
    return model.forward(ids, 0, None)[0]


@pytest.mark.parametrize("name", ["tiny_ernie4_5_moe", "tiny_glm4_moe", "tiny_qwen3_moe", "tiny_mixtral"])
@pytest.mark.parametrize("routing", ["model", "balanced"])
def test_the_tensor_cast_experts_compute_what_transformers_grouped_mm_computes(name, routing):
    logits = {}
    for experts in ("grouped_mm", "tensor_cast"):
        model = _model(name, experts)
        assert model.description["experts_implementation"] == experts
        if routing == "balanced":
            balance_routing(model.model)
        logits[experts] = _logits(model, 12)
    torch.testing.assert_close(logits["tensor_cast"], logits["grouped_mm"], rtol=1e-5, atol=1e-5)


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def test_one_moe_layer_issues_msmodelings_graph():
    """tiny glm4_moe, one MoE layer (its first layer is dense), 5 tokens x top-2 over 8 experts, balanced: every
    expert has 1 or 2 rows, so 8 x (gate, up, down) GEMMs, silu and up * silu; 8 one-block cats, one joining the
    blocks and one joining the outputs; the counts computed once per ids tensor."""
    model = _model("tiny_glm4_moe", "tensor_cast")
    balance_routing(model.model)
    experts = model.model.model.layers[1].mlp.experts
    calls = []
    experts.register_forward_pre_hook(lambda module, args: calls.append(args[1]))
    hidden = torch.randn(5, model.config.hidden_size)
    _logits(model, 5)                                         # the balanced ids of 5 tokens, and their counts
    ids = calls[-1]
    weights = torch.full(ids.shape, 0.5)
    with _Ops() as ops, torch.profiler.profile() as profile:
        experts(hidden, ids, weights)
    assert ops.seen["mm"] == 3 * 8 and ops.seen["silu"] == 8 and ops.seen["cat"] == 8 + 2
    assert ops.seen["bincount"] == 0                          # counted in the first forward, not again
    assert ops.seen["argsort"] + ops.seen["sort"] == 2        # init_routing_v2 and unpermute_tokens sort the ids
    ranges = Counter(event.name for event in profile.events() if event.name.startswith("tensor_cast."))
    assert ranges == {tensor_cast_experts.PERMUTE_RANGE: 1, tensor_cast_experts.UNPERMUTE_RANGE: 1}


def test_experts_with_an_empty_block_skip_it_as_msmodeling_does():
    """3 tokens x top-2 = 6 copies over 8 experts: two experts get none and run no GEMM."""
    model = _model("tiny_glm4_moe", "tensor_cast")
    experts = model.model.model.layers[1].mlp.experts
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]])
    with _Ops() as ops:
        out = experts(torch.randn(3, model.config.hidden_size), ids, torch.full((3, 2), 0.5))
    assert out.shape == (3, model.config.hidden_size)
    assert ops.seen["mm"] == 3 * 6 and ops.seen["bincount"] == 1   # a new ids tensor is counted


def test_experts_msmodeling_does_not_model_are_refused_naming_the_option():
    """gpt-oss's experts have biases and an interleaved gate/up: not msmodeling's MoeExpertMLP."""
    model = _model("tiny_gpt_oss", "tensor_cast")
    with pytest.raises(OpperfError, match="GptOssExperts: the tensor_cast experts implementation runs") as error:
        _logits(model, 4)
    assert error.value.field == "--experts-implementation"
