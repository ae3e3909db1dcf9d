#!/usr/bin/env python
"""Fresh pages for outputs: one op's profiler time with glibc's default malloc and with every tensor of 64 KiB
or more a fresh mmap (run it twice: plain, and with MALLOC_MMAP_THRESHOLD_=65536 in the environment).
Prints the median of 30 calls (CpuProfilerTimer, 1 thread) and minor page faults per call."""
import resource
import statistics
import sys

import torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from opperf.replay.timing import CpuProfilerTimer
from opperf.replay.inputs import ReplayCase
torch.manual_seed(0)

for name, case in {"silu [1,64,688]": ReplayCase(torch.ops.aten.silu, (torch.randn(1,64,688),)),
                   "mul [1,64,688]x2": ReplayCase(torch.ops.aten.mul, (torch.randn(1,64,688), torch.randn(1,64,688))),
                   "mm [64,256]x[256,1376]^T": ReplayCase(torch.ops.aten.mm, (torch.randn(64,256), torch.randn(1376,256).t()))}.items():
    t = CpuProfilerTimer(1)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t.measure(case, 3, 30, name)
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    s = t.collect()[name].samples_us
    print(f"{name}: median {statistics.median(s):.1f} us, minor page faults per call {(f1-f0)/33:.0f}")
