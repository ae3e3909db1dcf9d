#!/usr/bin/env python
"""Does a weight the GPU has not touched for gigabytes read slower than one flushed from L2? (issue 18)

The `moe` development workload's expert GEMMs, (T, 4096) x a (4096, 3072) weight read transposed (24 MiB bf16,
one per expert), replay at 0.68-0.77x their profiled time (10.4 µs against 13.6 µs at T = 1) and hold its
time-weighted gap at 5.2 %. Replay reads the same weight every call, after a flush of L2 (`insitu`: the weight is
cold). Inside the workload each call reads another expert's weight, last touched a whole forward pass earlier,
with gigabytes of other weights read in between: whatever caches translations or DRAM state besides L2 is cold
too. This times the GEMM with its weight drawn in turn from K distinct copies (K x 24 MiB apart, up to
12 GiB), each call after the same L2 flush, against the one-weight replay.

    python benchmarks/weight_rotation_probe.py [--calls 30] [--json OUT]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from opperf.replay.timing import RangeSession, range_device_times  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from device_result import calls_arguments, driver_version, write_json  # noqa: E402

COPIES = (1, 2, 8, 32, 128, 512)
SHAPES = ((1, 4096, 3072), (4, 4096, 3072), (16, 4096, 3072), (8, 1536, 4096), (64, 5120, 25600))
PROFILED_US = {(1, 4096, 3072): 13.58, (4, 4096, 3072): 13.73, (16, 4096, 3072): 14.47, (8, 1536, 4096): 6.97}


def main(argv=None) -> int:
    args = calls_arguments(__doc__, 30, argv)
    device = torch.device("cuda")
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    flush = torch.ones(2 * l2 // 4, dtype=torch.int32, device=device)
    session = RangeSession([torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA], strict=True)
    plan = []
    for m, k, n in SHAPES:
        x = torch.randn(m, k, dtype=torch.bfloat16, device=device)
        budget = max(c for c in COPIES if c * k * n * 2 <= 13 * 2**30)
        weights = torch.randn(budget, n, k, dtype=torch.bfloat16, device=device)   # each (n, k), read as .t()
        twin = x.clone()
        for copies in (c for c in COPIES if c <= budget):
            name = session.range_name(((m, k, n), copies), args.calls, "insitu")
            for i in range(args.calls + 3):
                w = weights[(i * (budget // copies)) % budget if copies > 1 else 0].t()
                flush.sum()
                x.copy_(twin)                    # the activation warm, as insitu leaves it
                if i >= 3:
                    with torch.profiler.record_function(name):
                        torch.mm(x, w)
                else:
                    torch.mm(x, w)
            plan.append(((m, k, n), copies))
        torch.cuda.synchronize()
        del weights
        torch.cuda.empty_cache()
    timed = session.collect(range_device_times, "cupti")
    rows = []
    print(f"{'shape (M, K, N)':22} {'copies':>6} {'GiB apart':>9} {'median µs':>10} {'cv':>6}  vs one  vs profiled")
    for shape, copies in plan:
        samples = timed[(shape, copies)].samples_us
        median = statistics.median(samples)
        one = statistics.median(timed[(shape, 1)].samples_us)
        span = copies * shape[1] * shape[2] * 2 / 2**30
        profiled = PROFILED_US.get(shape)
        rows.append({"shape": list(shape), "copies": copies, "gib_between_reuse": round(span, 3),
                     "median_us": round(median, 3), "cv": round(statistics.pstdev(samples) / statistics.mean(samples), 4),
                     "ratio_to_one_copy": round(median / one, 4), "profiled_us": profiled})
        vs = f"{median / profiled:6.3f}" if profiled else "     -"
        print(f"{str(shape):22} {copies:6d} {span:9.2f} {median:10.3f} {rows[-1]['cv']:6.3f}  {median / one:6.3f}  {vs}")
    result = {"device": torch.cuda.get_device_name(device), "driver": driver_version(), "torch": torch.__version__,
              "calls": args.calls, "cache_state": "L2 flushed (read 2x L2) before each call, activation rewritten",
              "rows": rows}
    write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
