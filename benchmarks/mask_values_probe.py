"""Whether a mask's values set `masked_fill_`'s time: the workload's all-False sentinel mask against replay's draw.

transformers' grouped-mm MoE layer zeroes expert-parallel sentinel rows with `masked_fill_(sentinel_mask, 0.0)`
on the gathered tokens and on the expert projections' outputs (`integrations/moe.py`). Without expert parallelism,
no row is a sentinel: the mask (S, 1) is all False. Replay draws bool tensors as random masks (opperf.replay.schema).
The large `masked_fill_` rows of every transformers MoE workload replay 7-8 % fast at full clock (OLMoE, Qwen2-MoE,
Mixtral; benchmarks/results/cuda_replay_reuse/), the small ones within 4 %.

This probe times `self.masked_fill_(mask, 0.0)` on bf16 (S, H) with a (S, 1) bool mask, right after the gather
that writes `self` (as in the workload: `hidden_states[perm // top_k]`), with the mask all False, random (replay),
and all True: the kernel's device time from a torch.profiler (CUPTI) session, mean over the calls.

    python benchmarks/mask_values_probe.py [--output benchmarks/results/mask_values]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from device_result import mean_device_us, probe_arguments, write_device_result  # noqa: E402

MASKS = ("false", "random", "true")
SHAPES = ((1024, 2048), (16384, 2048), (65536, 2048), (262144, 2048), (16384, 28672), (65536, 28672))


def make_mask(kind: str, rows: int) -> torch.Tensor:
    if kind == "false":
        return torch.zeros(rows, 1, dtype=torch.bool, device="cuda")
    if kind == "true":
        return torch.ones(rows, 1, dtype=torch.bool, device="cuda")
    return torch.randint(0, 2, (rows, 1), device="cuda").bool()


def fill_time(shape: tuple[int, int], kind: str, repeats: int = 10) -> float:
    """Mean device time (µs) of masked_fill_ over `repeats` calls, each right after the gather writing `self`."""
    from torch.profiler import ProfilerActivity, profile

    rows, hidden = shape
    source = torch.randn(rows // 4 + 1, hidden, device="cuda", dtype=torch.bfloat16)
    index = torch.randint(0, source.shape[0], (rows,), device="cuda")
    mask = make_mask(kind, rows)
    for _ in range(3):
        source[index].masked_fill_(mask, 0.0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            target = source[index]
            target.masked_fill_(mask, 0.0)
        torch.cuda.synchronize()
    return mean_device_us(prof, "aten::masked_fill_")


def main(argv: list[str] | None = None) -> int:
    args = probe_arguments(__doc__, REPO / "benchmarks" / "results" / "mask_values", 3, argv)
    rows = []
    print(f"{'shape':>14} " + " ".join(f"{kind + ' us':>11}" for kind in MASKS) + f" {'random/false':>13}")
    for shape in SHAPES:
        trials: dict[str, list[float]] = {kind: [] for kind in MASKS}
        for _ in range(args.trials):
            for kind in MASKS:
                trials[kind].append(fill_time(shape, kind))
        row = {"shape": list(shape), **{f"{kind}_us": statistics.median(trials[kind]) for kind in MASKS},
               "trials_us": trials}
        row["random_over_false"] = row["random_us"] / row["false_us"]
        rows.append(row)
        print(f"{'x'.join(map(str, shape)):>14} " + " ".join(f"{row[kind + '_us']:>11.2f}" for kind in MASKS)
              + f" {row['random_over_false']:>13.3f}")
        torch.cuda.empty_cache()
    write_device_result(args.output, "mask_values_probe.py", trials=args.trials, cases=rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
