"""Why MoE histogram ops (`bincount`, `histc`: tokens per expert) replay fast: the workload's own ids against replay's.

`bincount` replays at 0.71 of its profiled time on the reference MoE decoder, `histc` at 0.92-0.94 on the
transformers MoE models (docs/replay.md, "MoE routing"). A trace records their inputs as shapes; replay draws the
values (opperf.replay.schema: `bincount` ids uniform below the output length; other tensors by dtype). A
histogram kernel adds into one counter per bin with atomics, so its time may depend on how the ids are spread:
a random-weight router sends many tokens to a few experts, and every thread adding to the same counter waits.

This probe runs the MoE workloads of benchmarks/cuda_replay.py (same dims, layers, prefill and decode plan, seed),
records every `aten.bincount` / `aten.histc` call's input values under a TorchDispatchMode, and times each
call (its kernels' device time from a torch.profiler session, mean of 25 calls after 5 warm-up calls,
inputs resident) with:

  actual   the workload's own values
  replay   what replay's value rules draw: bincount ids uniform below the output length (its definition),
           histc's float input standard normal (the schema's rule for a tensor without one)
  uniform  ids uniform over the bins (a balanced router)
  one-bin  every id in one bin (the worst contention)
  shuffled the workload's own values in a random order: what replay builds from the recorded counts
           (opperf.input_values, `Profiling Input Values`), which keep how the ids pile up but not their order

and prints, per workload and op, the median time ratios and the ids' skew (largest bin over the mean), and writes
benchmarks/results/histogram/<device>.json.

    python benchmarks/histogram_probe.py [--workloads moe hf_mixtral_8x2 ...] [--output DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from cuda_replay import WORKLOADS  # noqa: E402
from device_result import write_device_result  # noqa: E402
from workload_calls import OpCalls, record_calls  # noqa: E402


OPS = {"bincount": torch.ops.aten.bincount, "histc": torch.ops.aten.histc}


def histogram_call(name: str, args: tuple, kwargs: dict):
    """(op, input values on the host, the other arguments, keyword arguments) of a bincount/histc call."""
    return name, args[0].detach().cpu(), tuple(args[1:]), dict(kwargs)


def run(op: str, values: torch.Tensor, rest: tuple, kwargs: dict):
    return OPS[op](values, *rest, **kwargs)


def time_call(op, values, rest, kwargs, repeats: int = 25, warmup: int = 5) -> float:
    """Device time per call: the summed durations of the kernels (and memsets) its calls launched, from a
    torch.profiler (CUPTI) session, divided by the calls; as a trace and replay time a row. (CUDA events would
    time bincount's host round trip for its output length, ~80 µs, not the ~5 µs of kernels.)"""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        run(op, values, rest, kwargs)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as session:
        for _ in range(repeats):
            run(op, values, rest, kwargs)
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in session.key_averages()) / repeats


def bins_of(op: str, values: torch.Tensor, rest: tuple, kwargs: dict) -> tuple[int, float, float]:
    """(bins, low, high): bincount's minlength (or max + 1), histc's bins and range."""
    if op == "bincount":
        minlength = int(kwargs.get("minlength", rest[1] if len(rest) > 1 else 0) or 0)
        return max(minlength, int(values.max()) + 1 if values.numel() else 0), 0.0, 0.0
    bins = int(kwargs.get("bins", rest[0] if rest else 100))
    low = float(kwargs.get("min", rest[1] if len(rest) > 1 else 0))
    high = float(kwargs.get("max", rest[2] if len(rest) > 2 else 0))
    return bins, low, high


def variants(op: str, values: torch.Tensor, rest: tuple, kwargs: dict) -> dict[str, torch.Tensor]:
    """The inputs each variant times (on the device), replay's built the way scripts/replay.py builds it."""
    bins, low, high = bins_of(op, values, rest, kwargs)
    generator = torch.Generator().manual_seed(values.numel())
    uniform = torch.randint(0, bins, values.shape, generator=generator)
    if op == "histc":                       # bin centres of [low, high]
        width = (high - low) / bins if high > low else 1.0
        uniform = (low + (uniform.to(torch.float64) + 0.5) * width).to(values.dtype)
    else:
        uniform = uniform.to(values.dtype)
    one_bin = torch.full_like(values, values.flatten()[0].item() if values.numel() else 0)
    order = torch.randperm(values.numel(), generator=torch.Generator().manual_seed(values.numel()))
    shuffled = values.flatten()[order].reshape(values.shape)
    return {"actual": values, "replay": replay_values(op, values, bins), "uniform": uniform, "one-bin": one_bin,
            "shuffled": shuffled}


def replay_values(op: str, values: torch.Tensor, bins: int) -> torch.Tensor:
    """What replay's schema rules give this input: bincount ids uniform in [0, bins); a float tensor
    standard normal (torch.randn), as for any tensor without a value rule."""
    generator = torch.Generator().manual_seed(0)
    if op == "bincount":
        return torch.randint(0, max(bins, 1), values.shape, generator=generator).to(values.dtype)
    return torch.randn(values.shape, generator=generator).to(values.dtype)


def probe(name: str) -> list[dict]:
    calls = record_calls(name, OpCalls(OPS, histogram_call))
    results = []
    for op, values, rest, kwargs in calls:
        bins, low, high = bins_of(op, values, rest, kwargs)
        ids = values.to(torch.float64)
        if op == "histc":
            ids = ((ids - low) / ((high - low) / bins) if high > low else ids).floor().clamp(0, bins - 1)
        counts = torch.bincount(ids.to(torch.int64).flatten(), minlength=bins)
        mean = values.numel() / bins
        times = {label: time_call(op, v.cuda(), rest, kwargs) for label, v in variants(op, values, rest, kwargs).items()}
        results.append({"workload": name, "op": op, "elements": values.numel(), "bins": bins,
                        "max_over_mean": float(counts.max()) / mean if mean else 0.0,
                        "empty_bins": int((counts == 0).sum()), "us": times,
                        **{f"{k}_over_actual": times[k] / times["actual"] for k in times if k != "actual"}})
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    moe = ["moe", "hf_mixtral_8x2", "hf_qwen2_moe_60x4", "hf_olmoe_64x8", "hf_deepseek_v2_lite"]
    parser.add_argument("--workloads", nargs="+", default=moe, choices=sorted(WORKLOADS))
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "histogram"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the ids' cost is the device's)")
    rows = []
    for name in args.workloads:
        found = probe(name)
        print(f"{name}: {len(found)} histogram calls", flush=True)
        rows.extend(found)
    print("\n| workload | op | calls | elements (median) | bins | largest bin / mean (median) | actual µs (median) "
          "| replay / actual | uniform / actual | one-bin / actual | shuffled / actual |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    summary = []
    for name in args.workloads:
        for op in OPS:
            group = [r for r in rows if r["workload"] == name and r["op"] == op]
            if not group:
                continue

            def med(key, group=group):
                return statistics.median(r[key] for r in group)

            entry = {"workload": name, "op": op, "calls": len(group), "elements": med("elements"),
                     "bins": group[0]["bins"], "max_over_mean": med("max_over_mean"),
                     "actual_us": statistics.median(r["us"]["actual"] for r in group),
                     **{k: med(k) for k in ("replay_over_actual", "uniform_over_actual", "one-bin_over_actual",
                                             "shuffled_over_actual")}}
            summary.append(entry)
            print(f"| {name} | {op} | {entry['calls']} | {entry['elements']:.0f} | {entry['bins']} | "
                  f"{entry['max_over_mean']:.2f} | {entry['actual_us']:.2f} | {entry['replay_over_actual']:.3f} | "
                  f"{entry['uniform_over_actual']:.3f} | {entry['one-bin_over_actual']:.3f} | "
                  f"{entry['shuffled_over_actual']:.3f} |")
    write_device_result(args.output, "histogram_probe.py", summary=summary, calls=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
