"""Run a benchmark workload once (benchmarks/cuda_replay.py's WORKLOADS, same plan and seed) and record the
argument values of chosen ops under a TorchDispatchMode: what a trace records as shapes only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cuda_replay import WORKLOADS
from opperf.workload.model import ReferenceDecoder, load_model_dims
from opperf.workload.profile import WorkloadPlan, make_token_ids, run_workload

REPO = Path(__file__).resolve().parents[1]


class OpCalls(TorchDispatchMode):
    """Appends `record(op name, args, kwargs)` for every call of the ops in `ops` (name: overload packet)."""

    def __init__(self, ops: dict, record: Callable[[str, tuple, dict], object]):
        super().__init__()
        self.ops, self.record, self.calls = ops, record, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for name, packet in self.ops.items():
            if func.overloadpacket is packet:
                entry = self.record(name, args, kwargs)
                if entry is not None:
                    self.calls.append(entry)
        return func(*args, **kwargs)


def record_calls(name: str, recorder: OpCalls) -> list:
    """Run workload `name` on cuda once under `recorder` (the reference decoder or a transformers model, random
    weights, bf16, plan and seed as benchmarks/cuda_replay.py profiles it); the model is freed after."""
    workload = WORKLOADS[name]
    plan = WorkloadPlan(batch_size=1, prefill_lengths=workload.prefill_lengths, decode_steps=workload.decode_steps,
                        decode_context=workload.decode_context, decode_batch_sizes=workload.decode_batch_sizes,
                        warmup_iterations=0, seed=0)
    if workload.source == "reference":
        dims = load_model_dims(REPO / "config" / "models.yaml", workload.model, num_layers=workload.layers)
        model, vocab = ReferenceDecoder(dims, "cuda", torch.bfloat16, seed=plan.seed), dims.vocab_size
    else:
        from opperf.workload.transformers_model import TransformersCausalLM, read_config

        config = read_config(REPO / workload.model, num_layers=workload.layers)
        model = TransformersCausalLM(config, "cuda", torch.bfloat16, seed=plan.seed, path=workload.model)
        vocab = model.vocab_size
    model.prepare_rope(plan.max_positions)
    with recorder:
        run_workload(model, plan, make_token_ids(plan, vocab, "cuda"), "cuda")
    del model
    torch.cuda.empty_cache()
    return recorder.calls
