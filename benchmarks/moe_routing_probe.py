"""How a MoE model's router splits tokens over experts, and what the split does to `_grouped_mm`'s time.

A torch.profiler trace records `_grouped_mm`'s `offs` as a shape, never its values, so replay has to choose the
tokens per expert. This probe runs the transformers MoE workloads of benchmarks/cuda_replay.py (same configs,
layers, prefill lengths and decode plan, same seed), records every `_grouped_mm` call's real `offs` under a
TorchDispatchMode (no profiler), and times each distinct call on the device three ways:

  actual   the workload's own offsets
  routed   opperf.replay.schema.routed_offsets (each routed row to a uniformly random expert; replay's choice)
  even     groups as even as integers allow (replay's choice before)

Timer: CUDA events around one call, 5 warm-up calls then the median of 25, inputs resident (no flush: the
three splits see the same cache state, only their ratio matters). Prints a table and writes
benchmarks/results/moe_routing/<device>.json with the per-call group-size statistics (max/mean, coefficient
of variation, empty experts) and the time ratios routed/actual and even/actual.

    python benchmarks/moe_routing_probe.py [--workloads hf_mixtral_8x2 hf_olmoe_64x8] [--output DIR]
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

from opperf.replay.schema import even_offsets, routed_offsets  # noqa: E402


def grouped_call(name: str, args: tuple, kwargs: dict):
    """(A shape, B shape, B strides, dtype, offs values, offs dtype) of a _grouped_mm call with offsets."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if offs is None:
        return None
    return tuple(a.shape), tuple(b.shape), tuple(b.stride()), a.dtype, tuple(offs.tolist()), offs.dtype


def time_call(a, b, offs, repeats: int = 25, warmup: int = 5) -> float:
    for _ in range(warmup):
        torch._grouped_mm(a, b, offs=offs)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch._grouped_mm(a, b, offs=offs)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def sizes_of(ends) -> list[int]:
    return [b - a for a, b in zip([0, *ends], ends)]


def probe(name: str) -> list[dict]:
    calls = record_calls(name, OpCalls({"_grouped_mm": torch.ops.aten._grouped_mm}, grouped_call))
    results, seen = [], set()
    for a_shape, b_shape, b_stride, dtype, offs, offs_dtype in calls:
        key = (a_shape, b_shape, offs)
        if key in seen:
            continue
        seen.add(key)
        total, groups = offs[-1], len(offs)
        a = torch.randn(a_shape, dtype=dtype, device="cuda")
        b = torch.empty_strided(b_shape, b_stride, dtype=dtype, device="cuda").normal_()
        splits = {"actual": list(offs), "routed": routed_offsets(total, groups), "even": even_offsets(total, groups)}
        times = {label: time_call(a, b, torch.tensor(ends, dtype=offs_dtype, device="cuda"))
                 for label, ends in splits.items()}
        actual = sizes_of(offs)
        mean = total / groups
        results.append({
            "workload": name, "a": list(a_shape), "b": list(b_shape), "rows": total, "experts": groups,
            "max_over_mean": max(actual) / mean if mean else 0.0,
            "cv": statistics.pstdev(actual) / mean if mean else 0.0,
            "empty_experts": sum(1 for s in actual if s == 0),
            "routed_empty_experts": sum(1 for s in sizes_of(splits["routed"]) if s == 0),
            "us": times, "routed_over_actual": times["routed"] / times["actual"],
            "even_over_actual": times["even"] / times["actual"],
        })
        del a, b
    return results


def summarize(rows: list[dict]) -> dict:
    def gap(key):
        gaps = sorted(abs(1 - r[key]) for r in rows)
        return {"median_gap": statistics.median(gaps), "p90_gap": gaps[int(0.9 * (len(gaps) - 1))],
                "time_weighted_gap": sum(abs(r["us"][key.split("_")[0]] - r["us"]["actual"]) for r in rows)
                / sum(r["us"]["actual"] for r in rows)}
    return {"calls": len(rows), "routed": gap("routed_over_actual"), "even": gap("even_over_actual")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    moe = [n for n, w in WORKLOADS.items() if w.source == "transformers" and n != "hf_mistral"]
    parser.add_argument("--workloads", nargs="+", default=moe, choices=moe)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "moe_routing"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (the split's cost is the device's)")
    rows = []
    for name in args.workloads:
        rows.extend(probe(name))
    print(f"{'workload':<20} {'A':>14} {'experts':>7} {'max/mean':>8} {'cv':>5} {'empty':>5} "
          f"{'actual us':>10} {'routed/act':>10} {'even/act':>9}")
    for r in rows:
        print(f"{r['workload']:<20} {'x'.join(map(str, r['a'])):>14} {r['experts']:>7} {r['max_over_mean']:>8.2f} "
              f"{r['cv']:>5.2f} {r['empty_experts']:>5} {r['us']['actual']:>10.1f} {r['routed_over_actual']:>10.3f} "
              f"{r['even_over_actual']:>9.3f}")
    summary = {name: summarize([r for r in rows if r["workload"] == name]) for name in args.workloads}
    for name, s in summary.items():
        print(f"{name}: {s['calls']} calls; routed median/p90/tw gap {s['routed']['median_gap']:.1%} / "
              f"{s['routed']['p90_gap']:.1%} / {s['routed']['time_weighted_gap']:.1%}; even "
              f"{s['even']['median_gap']:.1%} / {s['even']['p90_gap']:.1%} / {s['even']['time_weighted_gap']:.1%}")
    write_device_result(args.output, "moe_routing_probe.py", summary=summary, calls=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
