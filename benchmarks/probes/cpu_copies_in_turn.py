#!/usr/bin/env python
"""How a decode GEMV's CPU time depends on how replay puts its weight's reuse distance between calls.

The CPU replay gives a reused input its profiled reuse distance D by taking turns over 1 + D/S copies of it
(opperf/replay/timing.py, cpu_cold_turns), after 2 warm-up calls. On the idle Xeon the demo's decode GEMVs then
replay at 1.5-2.2x their profile (benchmarks/results/cpu_replay/). This probe times the GEMV `x[1,K] @ W[N,K]^T`
(fp32, 1 thread) as its own profiler event, 60 calls per setting, the settings alternated over rounds:

  copies:N         N copies of W in turn, 2 warm-up calls (the replay's way)
  copies:N+round   the same after one untimed call on every copy
  stream:MIB       one W, and MIB of other data read between calls (the distance as a stream, not copies)

and prints the median and mean op event (µs) per setting, and writes them as JSON (--output). With --trajectory N,
it also times N calls over the copies after a warm round, in one go, and gives the median of each 20 calls: on the
2-core EPYC VM a 1.34 MiB weight over 8 copies took 125 µs a call for the first 20 calls and 50 from the 60th on,
the cache learning the cycle (`benchmarks/results/cpu_replay/copies_in_turn/epyc/`). The replay's 2 warm-up and 30
timed calls see the start of that curve, and how far along depends on the number of copies.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

MIB = 2**20


def time_setting(x, weights: list, calls: int, warm_round: bool, stream: torch.Tensor | None) -> list[float]:
    mm = torch.ops.aten.mm.default
    for call in range(len(weights) if warm_round else 2):
        mm(x, weights[call % len(weights)].t())
    start = len(weights) if warm_round else 2
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for call in range(calls):
            if stream is not None:
                stream.sum()
            with record_function("opperf_replay#0"):
                mm(x, weights[(start + call) % len(weights)].t())
    return [e.cpu_time_total for e in prof.events() if e.name == "aten::mm"][-calls:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=int, nargs=2, default=[256, 256], metavar=("N", "K"))
    parser.add_argument("--distance-mib", type=float, default=10.0, help="the profiled reuse distance to put")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--trajectory", type=int, default=0, metavar="N",
                        help="also N calls over the copies after a warm round, medians per 20 calls")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, k = args.shape
    x = torch.rand(1, k)
    size = n * k * 4
    copies = max(2, 1 + round(args.distance_mib * MIB / size))
    pool = [torch.rand(n, k) for _ in range(copies)]
    stream = torch.rand(int(args.distance_mib * MIB) // 4)
    settings = {"copies:1": (pool[:1], False, None), f"copies:{copies}": (pool, False, None),
                f"copies:{copies}+round": (pool, True, None), f"stream:{args.distance_mib:g}": (pool[:1], False, stream)}
    samples: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.rounds):
        for name, (weights, warm_round, between) in settings.items():
            samples[name] += time_setting(x, weights, args.calls, warm_round, between)
    table = {name: {"median_us": round(statistics.median(v), 2), "mean_us": round(statistics.fmean(v), 2)}
             for name, v in samples.items()}
    trajectory = []
    if args.trajectory:
        calls = time_setting(x, [w.clone() for w in pool], args.trajectory, True, None)
        trajectory = [round(statistics.median(calls[i:i + 20]), 2) for i in range(0, len(calls), 20)]
    print(f"GEMV [1,{k}] x [{n},{k}]^T fp32, weight {size / MIB:.2f} MiB, distance {args.distance_mib:g} MiB")
    for name, row in table.items():
        print(f"  {name:<16} median {row['median_us']:8.2f}  mean {row['mean_us']:8.2f}")
    if trajectory:
        print(f"  copies:{copies}, {args.trajectory} calls after a warm round, median per 20 calls: {trajectory}")
    if args.output:
        args.output.write_text(json.dumps({
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs",
            "torch": torch.__version__, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "shape": args.shape, "distance_mib": args.distance_mib, "calls": args.calls, "rounds": args.rounds,
            "table": table, "trajectory_median_per_20_calls_us": trajectory}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
