#!/usr/bin/env python
"""Where a replay job's fixed cost goes on a GPU host: torch import, CUDA context, the first profiler session,
a later session, and the job parent's own imports (pandas, opperf's replay CLI). Prints one line each.

    python benchmarks/startup_probe.py        # on an NVIDIA host; run twice (the first pays cold file caches)

Measured on the H100 of benchmarks/results/cuda_replay (2026-11-23): import torch 4.6-5.8 s, CUDA context
0.3-0.4 s, first profiler session 5.0-5.8 s, later sessions 6 ms, pandas 0.4-0.7 s, opperf replay CLI 0.2 s.
"""

import importlib
import sys
import time
from pathlib import Path


def main() -> int:
    began = time.perf_counter()
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    imported = time.perf_counter()
    x = torch.randn(256, 256, device="cuda")
    torch.cuda.synchronize()
    context = time.perf_counter()
    timings = {"import torch": imported - began, "CUDA context": context - imported}
    for name in ("first profiler session", "second profiler session"):
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as session:
            with record_function("probe"):
                x @ x
            torch.cuda.synchronize()
        session.profiler.kineto_results.events()
        timings[name] = time.perf_counter() - start
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for module in ("pandas", "opperf.replay.cli"):
        start = time.perf_counter()
        importlib.import_module(module)
        timings[f"import {module}"] = time.perf_counter() - start
    for name, seconds in timings.items():
        print(f"{name:28s} {seconds:7.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
