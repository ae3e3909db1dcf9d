"""Where a replay job's fixed cost goes on a GPU host: torch import, CUDA context, the first profiler session."""
import time, sys
t0=time.perf_counter()
import torch
t1=time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2=time.perf_counter()
from torch.profiler import profile, ProfilerActivity, record_function
x=torch.randn(256,256,device="cuda")
p=profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]); p.__enter__()
t3=time.perf_counter()
with record_function("r"): x@x
torch.cuda.synchronize(); p.__exit__(None,None,None)
t4=time.perf_counter()
ev=p.profiler.kineto_results.events()
t5=time.perf_counter()
p=profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]); p.__enter__()
with record_function("r"): x@x
torch.cuda.synchronize(); p.__exit__(None,None,None)
t6=time.perf_counter()
print(f"import torch {t1-t0:.2f} cuda init {t2-t1:.2f} profiler first start {t3-t2:.2f} first stop {t4-t3:.2f} events {t5-t4:.3f} second session {t6-t5:.3f}")
t7=time.perf_counter()
sys.path.insert(0,'.')
import pandas
t8=time.perf_counter()
import opperf.replay.cli, opperf.replay.job
t9=time.perf_counter()
print(f"import pandas {t8-t7:.2f} opperf.replay.cli+job {t9-t8:.2f}")
