"""How tests/data/comm/nccl_trace_rank0.json was made: a real torch.profiler CUDA trace of 3 NCCL
all_reduce calls with a non-NCCL kernel (fill_) before each, on 2 GPUs (events of rank 0 kept).

    torchrun --standalone --nproc-per-node 2 tests/data/comm/capture_cuda_trace.py OUT_DIR
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda", dtype=torch.bfloat16)
dist.all_reduce(x)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        x.fill_(1.0)
        dist.all_reduce(x)
    torch.cuda.synchronize()
prof.export_chrome_trace(os.path.join(sys.argv[1], f"nccl_trace_rank{rank}.json"))
dist.destroy_process_group()
