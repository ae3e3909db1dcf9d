"""The CPU profiler timer on real ops in real torch.profiler sessions: every key gets its calls, a call's
sample is the time of the ops at the top of its range (not the Python around them), the method is recorded
per row, and it is the cpu back end's one timer (the wall clock around the call was measured and removed:
benchmarks/results/cpu_replay/)."""

from __future__ import annotations

import time

import pandas as pd
import torch

from opperf import contract
from opperf.replay.engine import STATUS_OK
from opperf.replay.inputs import ReplayCase
from opperf.replay.job import ReplaySettings, replay_kernel_csv
from opperf.replay.methods import METHOD_CPU_PROFILER
from opperf.replay.timing import CpuProfilerTimer, make_timer

SLEEP_S = 0.003


def test_profiler_timer_gives_every_key_its_own_samples_once():
    timer = CpuProfilerTimer(threads=1)
    add = ReplayCase(fn=torch.ops.aten.add, args=(torch.ones(64), torch.ones(64)))
    mm = ReplayCase(fn=torch.ops.aten.mm, args=(torch.ones(8, 16), torch.ones(16, 4)))
    timer.measure(add, 2, 4, "add")
    timer.measure(mm, 0, 3, ("mm", 7))
    timer.measure(add, 1, 1, "add again")
    results = timer.collect()
    assert sorted(results, key=str) == sorted(["add", ("mm", 7), "add again"], key=str)
    assert [len(results[k].samples_us) for k in ("add", ("mm", 7), "add again")] == [4, 3, 1]
    assert all(sample > 0 for result in results.values() for sample in result.samples_us)
    assert results["add"].method == f"{METHOD_CPU_PROFILER}, 1 threads"
    assert results["add"].l2_policy == "none"
    assert timer.collect() == {}
    timer.measure(add, 0, 2, "next batch")      # a new session after a collect
    assert [len(r.samples_us) for r in timer.collect().values()] == [2]


def test_a_calls_sample_is_its_top_level_ops_not_the_python_between_them():
    x = torch.ones(256)

    def two_ops_and_a_pause():
        torch.ops.aten.add(x, x)              # aten::add ...
        time.sleep(SLEEP_S)                   # ... Python time no op covers ...
        return torch.nn.functional.linear(x.view(1, 256), torch.ones(4, 256))   # ... aten::linear (t, addmm inside)

    case = ReplayCase(fn=two_ops_and_a_pause)
    profiler_timer = CpuProfilerTimer(threads=1)
    started = time.perf_counter()
    profiler_timer.measure(case, 1, 5, "row")
    assert time.perf_counter() - started >= 6 * SLEEP_S      # the calls did sleep ...
    profiled = profiler_timer.collect()["row"].samples_us
    assert len(profiled) == 5                 # one sample per call, nested ops (t, addmm) not counted as calls
    assert all(0 < sample < SLEEP_S * 1e6 for sample in profiled), profiled


def test_a_call_that_runs_no_op_gets_no_samples_and_spoils_no_other_row():
    timer = CpuProfilerTimer(threads=1)
    timer.measure(ReplayCase(fn=lambda: None), 0, 3, "no op")
    timer.measure(ReplayCase(fn=torch.ops.aten.neg, args=(torch.ones(8),)), 0, 3, "neg")
    results = timer.collect()
    assert list(results) == ["neg"] and len(results["neg"].samples_us) == 3


def test_the_cpu_back_end_times_with_the_profiler():
    assert isinstance(make_timer("cpu", cpu_threads=1), CpuProfilerTimer)


def test_a_replay_job_with_profiler_timing_records_the_method_per_row(tmp_path):
    rows = [{contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU", contract.INPUT_SHAPES: f"{m},8;8,4",
             contract.INPUT_DTYPES: "DT_FLOAT;DT_FLOAT", contract.INPUT_FORMATS: "ND;ND",
             contract.OUTPUT_SHAPES: f"{m},4", contract.OUTPUT_DTYPES: "DT_FLOAT", contract.OUTPUT_FORMATS: "ND",
             contract.PROFILING_AVERAGE: "1"} for m in (1, 2, 3)]
    path = tmp_path / "mm.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    output = tmp_path / "out.csv"
    replay_kernel_csv(path, "mm", "config/kernels", output,
                      ReplaySettings(repeat_count=4, warmup_count=1, cpu_threads=1), version_dir=None)
    written = pd.read_csv(output, dtype=str, keep_default_na=False)
    assert written[contract.REPLAY_STATUS].tolist() == [STATUS_OK] * 3
    assert written[contract.REPLAY_SAMPLE_COUNT].tolist() == ["4"] * 3
    assert written[contract.REPLAY_TIMING_METHOD].tolist() == [f"{METHOD_CPU_PROFILER}, 1 threads"] * 3
    assert all(float(v) > 0 for v in written[contract.REPLAY_AVERAGE])
