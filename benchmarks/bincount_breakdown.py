"""bincount's device work kernel by kernel, replayed, beside the same calls in a profiled workload's trace.

`bincount` replays at 0.71 of its profiled time on the reference MoE decoder, and not because of its ids
(benchmarks/results/histogram/). On CUDA one call is six device activities: two reductions (the ids' max and min),
two device-to-host copies of those (bincount sizes its output on the host: a synchronisation), a fill of the
output and the histogram kernel, each after a host round trip. This prints, per activity, the median duration
over the workload trace's bincount calls of each input size, and over --repeat calls of the same bincount here
(torch.profiler, ids uniform below minlength as replay draws them), and writes the table as JSON.

    python benchmarks/bincount_breakdown.py --trace TRACE.json.gz

The committed breakdown read the reference MoE trace, now only in history (issue 42):

    git show ecdd54f:benchmarks/results/cuda_replay/traces/moe_qwen3_235b_a22b_trace.json.gz > moe_trace.json.gz
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")


def label(name: str) -> str:
    for key in ("reduce_kernel", "Memcpy DtoH (Device -> Pageable)", "Memcpy DtoH (Device -> Pinned)",
                "elementwise_kernel", "kernelHistogram1D"):
        if key in name:
            return key
    return name[:40]


def activities_by_op(events: list[dict], op_name: str) -> list[tuple[int, list[tuple[str, float]]]]:
    """(input length, [(activity label, µs)]) per call of `op_name`, its device activities joined through the
    runtime calls inside the op by correlation id."""
    by_corr = defaultdict(list)
    for event in events:
        if event.get("cat") in ACTIVITY:
            by_corr[event.get("args", {}).get("correlation")].append(event)
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    calls = []
    for op in (e for e in events if e.get("cat") == "cpu_op" and e.get("name") == op_name):
        start, end = op["ts"], op["ts"] + op["dur"]
        work = [a for r in runtime if start <= r["ts"] <= end for a in by_corr.get(r["args"].get("correlation"), [])]
        dims = op.get("args", {}).get("Input Dims") or [[0]]
        calls.append((int(dims[0][0]) if dims[0] else 0, [(label(a["name"]), float(a["dur"])) for a in work]))
    return calls


def table(calls) -> dict[int, dict[str, float]]:
    """Per input length and activity, the median over calls of that activity's time in a call (the two
    reductions summed)."""
    grouped: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for length, work in calls:
        per_call: dict[str, float] = defaultdict(float)
        for name, us in work:
            per_call[name] += us
        for name, us in per_call.items():
            grouped[length][name].append(us)
    return {length: {name: statistics.median(v) for name, v in names.items()} for length, names in grouped.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="the workload's trace (.json or .json.gz)")
    parser.add_argument("--minlength", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--output", default=str(REPO / "benchmarks/results/histogram/bincount_breakdown.json"))
    args = parser.parse_args()
    with gzip.open(args.trace, "rt") if args.trace.endswith(".gz") else open(args.trace) as handle:
        workload = table(activities_by_op(json.load(handle)["traceEvents"], "aten::bincount"))
    from torch.profiler import ProfilerActivity, profile

    here = {}
    for length in sorted(workload):
        ids = torch.randint(0, args.minlength, (length,), device="cuda")
        for _ in range(5):
            torch.bincount(ids, minlength=args.minlength)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as session:
            for _ in range(args.repeat):
                torch.bincount(ids, minlength=args.minlength)
            torch.cuda.synchronize()
        path = Path(f"/tmp/bincount_{length}.json")
        session.export_chrome_trace(str(path))
        here[length] = table(activities_by_op(json.loads(path.read_text())["traceEvents"], "aten::bincount"))[length]
    names = sorted({n for t in (*workload.values(), *here.values()) for n in t})
    print(f"| ids | {' | '.join(names)} | total |\n|---|{'---:|' * (len(names) + 1)}")
    rows = []
    for length in sorted(workload):
        w, h = workload[length], here[length]
        cells = [f"{w.get(n, 0):.2f} / {h.get(n, 0):.2f}" for n in names]
        print(f"| {length} | {' | '.join(cells)} | {sum(w.values()):.2f} / {sum(h.values()):.2f} |")
        rows.append({"ids": length, "workload_us": w, "replayed_us": h})
    document = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "trace": args.trace,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "cells": "workload median / replayed median (µs)", "rows": rows}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
