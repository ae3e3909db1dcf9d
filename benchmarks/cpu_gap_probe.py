#!/usr/bin/env python
"""What separates a CPU replay's number from the workload profile's, one factor at a time, on real ops.

For a few calls of the demo workload (shapes and strides as its trace records them), each measured
30 times after 3 warm-up calls, median in µs:

- wall:            perf_counter around the Python call (`--cpu-timing wall`)
- profiler:        the op's CPU event in a torch.profiler session with record_shapes (`--cpu-timing profiler`,
                   how the parse stage timed the op inside the workload)
- profiler_plain:  the same without record_shapes (the profiler's own shape recording inside the event)
- profiler_cold:   profiler, after reading a buffer of 4 x the last-level cache before each call (nothing of
                   the inputs left in any cache; in the workload a weight is read once per forward)
- profiler_t2:     profiler with 2 intra-op threads instead of 1

Writes cpu_gap_probe.json and prints a markdown table. Run with the machine otherwise idle.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from opperf.replay.inputs import ReplayCase  # noqa: E402
from opperf.replay.timing import CpuProfilerTimer, CpuWallClockTimer, range_cpu_op_times  # noqa: E402

FLUSH_BYTES = 4 * 32 * 2**20       # 4 x a 32 MiB L3


def cases() -> dict[str, ReplayCase]:
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g)

    x1, x16 = r(1, 1, 256), r(1, 16, 256)
    return {
        "pow [1,1,256] ^ 2": ReplayCase(torch.ops.aten.pow, (x1, 2)),
        "sum [1,1,256] dim -1": ReplayCase(torch.ops.aten.sum, (x1, [-1], True), {"dtype": torch.float32}),
        "rsqrt [1,1,1]": ReplayCase(torch.ops.aten.rsqrt, (r(1, 1, 1),)),
        "mul [1,1,256] x [256]": ReplayCase(torch.ops.aten.mul, (x1, r(256))),
        "add [1,16,256] x2": ReplayCase(torch.ops.aten.add, (x16, r(1, 16, 256))),
        "mm [1,256] x [256,512]^T": ReplayCase(torch.ops.aten.mm, (r(1, 256), r(512, 256).t())),
        "mm [16,256] x [256,1376]^T": ReplayCase(torch.ops.aten.mm, (r(16, 256), r(1376, 256).t())),
        "mm [64,256] x [256,1376]^T": ReplayCase(torch.ops.aten.mm, (r(64, 256), r(1376, 256).t())),
        "index_select [4096,256] 16 rows": ReplayCase(torch.ops.aten.index_select,
                                                      (r(4096, 256), 0, torch.randint(0, 4096, (16,), generator=g))),
    }


def cold_median(case: ReplayCase, buffer: torch.Tensor, repeat: int) -> float:
    """Profiler op time with the buffer read before each call, outside the call's range."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    for _ in range(3):
        case.run()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as session:
        for _ in range(repeat):
            buffer.sum()
            with record_function("probe#0"):
                case.run()
    return statistics.median(range_cpu_op_times(session.profiler.kineto_results.events(), "probe#")[0])


def median(timer, case, key, repeat) -> float:
    timer.measure(case, 3, repeat, key)
    return statistics.median(timer.collect()[key].samples_us)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_replay")
    parser.add_argument("--repeat-count", type=int, default=30)
    args = parser.parse_args()
    load = os.getloadavg()
    buffer = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32)
    results = {}
    for name, case in cases().items():
        row = {"wall": median(CpuWallClockTimer(1), case, name, args.repeat_count),
               "profiler": median(CpuProfilerTimer(1), case, name, args.repeat_count),
               "profiler_plain": median(CpuProfilerTimer(1, record_shapes=False), case, name, args.repeat_count)}
        row["profiler_cold"] = cold_median(case, buffer, args.repeat_count)
        row["profiler_t2"] = median(CpuProfilerTimer(2), case, name, args.repeat_count)
        torch.set_num_threads(1)
        results[name] = row
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "cpus": os.cpu_count(), "load_average_before": load, "load_average_after": os.getloadavg(),
              "repeat_count": args.repeat_count, "median_us": results}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "cpu_gap_probe.json").write_text(json.dumps(report, indent=1))
    columns = ["wall", "profiler", "profiler_plain", "profiler_cold", "profiler_t2"]
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load {load[0]:.2f} -> {os.getloadavg()[0]:.2f}; "
          f"median µs of {args.repeat_count} calls\n")
    print("| call | " + " | ".join(columns) + " |\n|---|" + "---|" * len(columns))
    for name, row in results.items():
        print(f"| {name} | " + " | ".join(f"{row[c]:.2f}" for c in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
