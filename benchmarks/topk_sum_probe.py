"""What sets the time of a MoE layer's top-k reduction: the cache state its input was left in.

transformers' grouped-mm MoE layer (`integrations/moe.py`) ends with
    weighted_out = proj_out * sample_weights.unsqueeze(-1)      # fp32 (S, H), S = tokens x top-k
    weighted_out = weighted_out[inv_perm]                       # the permutation gather, fp32 (S, H)
    final = weighted_out.view(tokens, top_k, H).sum(dim=1)
Its `sum` rows of 0.2-1 M elements replay 0.85-0.93 of their in-workload time (Qwen2-MoE, DeepSeek-V2-Lite; H100
and H200), while the larger and the smaller ones agree. Replay's insitu state is: flush (read twice the L2), the
power policy's 4096^3 GEMM, then the warm input rewritten in place (`mul_(1)` on its bytes).

This probe times `sum(dim=1)` (CUPTI kernel time, mean over the calls) after each of:
  workload   the layer's own chain: down-projection-sized GEMM, the routing-weight mul, the permutation gather;
  replay     replay's insitu state as above;
  gather     flush, GEMM, then the permutation gather writes the input (replay's state with the real producer);
  mul        flush, GEMM, then the routing-weight mul writes the input directly (no gather);
  rewrite    flush, then only the in-place rewrite (no GEMM).

    python benchmarks/topk_sum_probe.py [--output benchmarks/results/topk_sum] [--trials 3]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from device_result import mean_device_us, probe_arguments, write_device_result  # noqa: E402

STATES = ("workload", "replay", "gather", "mul", "rewrite")
HIDDEN, INTERMEDIATE = 2048, 1408              # DeepSeek-V2-Lite's expert; Qwen2-MoE's hidden is 2048 too
CASES = ((6, 128), (6, 512), (6, 1024), (6, 2048), (4, 512), (4, 1024), (4, 2048))     # (top-k, tokens)


class Layer:
    """The tensors of one MoE layer's tail at (top_k, tokens), and the steps that leave `sum`'s input in a state."""

    def __init__(self, top_k: int, tokens: int):
        rows = top_k * tokens
        self.top_k, self.tokens = top_k, tokens
        self.activation = torch.randn(rows, INTERMEDIATE, device="cuda", dtype=torch.bfloat16)
        self.down = torch.randn(INTERMEDIATE, HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.weights = torch.rand(rows, device="cuda", dtype=torch.float32)
        self.perm = torch.randperm(rows, device="cuda")
        self.proj = self.activation @ self.down
        self.weighted = self.proj * self.weights.unsqueeze(-1)
        self.input = self.weighted[self.perm]
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.flush_buffer = torch.ones(2 * l2 // 4, dtype=torch.int32, device="cuda")
        self.gemm = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def prepare(self, state: str) -> torch.Tensor:
        if state == "workload":
            proj = self.activation @ self.down
            return (proj * self.weights.unsqueeze(-1))[self.perm]
        self.flush_buffer.amax()             # read twice the L2, as replay's flush (not a `sum`, the timed op)
        if state != "rewrite":
            self.gemm @ self.gemm
        if state == "gather":
            return self.weighted[self.perm]
        if state == "mul":
            return self.proj * self.weights.unsqueeze(-1)
        self.input.view(torch.uint8).mul_(1)
        return self.input

    def time(self, state: str, repeats: int = 20) -> float:
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            self.prepare(state).view(self.tokens, self.top_k, HIDDEN).sum(dim=1)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                self.prepare(state).view(self.tokens, self.top_k, HIDDEN).sum(dim=1)
            torch.cuda.synchronize()
        return mean_device_us(prof, "aten::sum")


def main(argv: list[str] | None = None) -> int:
    args = probe_arguments(__doc__, REPO / "benchmarks" / "results" / "topk_sum", 3, argv)
    rows = []
    print(f"{'top-k x tokens':>15} {'MiB':>5} " + " ".join(f"{s + ' us':>11}" for s in STATES)
          + f" {'replay/workload':>16}")
    for top_k, tokens in CASES:
        layer = Layer(top_k, tokens)
        trials: dict[str, list[float]] = {state: [] for state in STATES}
        for _ in range(args.trials):
            for state in STATES:
                trials[state].append(layer.time(state))
        row = {"top_k": top_k, "tokens": tokens, "hidden": HIDDEN,
               "input_mib": top_k * tokens * HIDDEN * 4 / 2**20,
               **{f"{state}_us": statistics.median(trials[state]) for state in STATES}, "trials_us": trials}
        row["replay_over_workload"] = row["replay_us"] / row["workload_us"]
        rows.append(row)
        print(f"{f'{top_k} x {tokens}':>15} {row['input_mib']:>5.0f} "
              + " ".join(f"{row[state + '_us']:>11.2f}" for state in STATES) + f" {row['replay_over_workload']:>16.3f}")
        del layer
        torch.cuda.empty_cache()
    write_device_result(args.output, "topk_sum_probe.py", trials=args.trials, cases=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
