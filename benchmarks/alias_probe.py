"""Whether a call whose inputs alias each other in the workload runs faster than replay's call on distinct tensors.

Every transformers decoder builds its rotary table with `torch.cat((freqs, freqs), dim=-1)`: one tensor passed
twice (the execution trace gives both slots one storage and offset). `freqs` is the transpose of a small fp32
matmul's output, read with a stride of T. That `cat` row (shape 1,T,64;1,T,64, five calls per profile) replays
1.10-1.17x slow on OLMoE and Qwen2-MoE (benchmarks/results/input_values/, issue 15), where replay builds one
tensor per slot. This probe times the call both ways, each right after the matmul that writes its input(s), as in
the workload: the kernels' device time from a torch.profiler (CUPTI) session, mean over the calls.

    python benchmarks/alias_probe.py [--output benchmarks/results/alias]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from device_result import mean_device_us, probe_arguments, write_device_result  # noqa: E402


def cat_time(tokens: int, half: int, aliased: bool, transposed: bool, repeats: int = 40, warmup: int = 10) -> float:
    """Mean device time (µs) of cat((f, f)) or cat((f, g)) over `repeats` calls, each after the matmul(s) that
    write its inputs (the rotary embedding's inv_freq @ positions, fp32)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    inv = torch.rand(1, half, 1, device="cuda")
    pos = torch.arange(tokens, device="cuda", dtype=torch.float32).reshape(1, 1, tokens)

    def inputs():
        f = inv @ pos
        g = f if aliased else inv @ (pos + 1)
        if transposed:
            return f.transpose(1, 2), g.transpose(1, 2)
        return f.reshape(1, tokens, half), g.reshape(1, tokens, half)

    for _ in range(warmup):
        torch.cat(inputs(), dim=-1)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            a, b = inputs()
            with record_function("timed_cat"):
                torch.cat((a, b), dim=-1)
        torch.cuda.synchronize()
    return mean_device_us(prof, "aten::cat")


def main(argv: list[str] | None = None) -> int:
    args = probe_arguments(__doc__, REPO / "benchmarks" / "results" / "alias", 5, argv)
    rows = []
    print(f"{'tokens':>7} {'half':>5} {'layout':>10} {'aliased us':>11} {'distinct us':>12} {'distinct/aliased':>17}")
    for transposed in (True, False):
        for half in (32, 64):
            for tokens in (1, 8, 128, 512, 2048, 8192):
                aliased, distinct = [], []
                for _ in range(args.trials):
                    aliased.append(cat_time(tokens, half, True, transposed))
                    distinct.append(cat_time(tokens, half, False, transposed))
                row = {"tokens": tokens, "half": half, "layout": "transposed" if transposed else "contiguous",
                       "aliased_us": statistics.median(aliased), "distinct_us": statistics.median(distinct),
                       "aliased_trials_us": aliased, "distinct_trials_us": distinct}
                row["ratio"] = row["distinct_us"] / row["aliased_us"]
                rows.append(row)
                print(f"{tokens:>7} {half:>5} {row['layout']:>10} {row['aliased_us']:>11.3f} "
                      f"{row['distinct_us']:>12.3f} {row['ratio']:>17.3f}")
    write_device_result(args.output, "alias_probe.py", trials=args.trials, cases=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
