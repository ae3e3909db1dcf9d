"""The GPU's power state joined to profiled rows: NVML samples beside a real CUDA trace, aligned by its sync range."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opperf.io import read_database_csv
from opperf.power_samples import (POWER_SAMPLES, SAMPLE_FIELDS, SYNC_RANGE, PowerSamples, reason_names,
                                  reason_shares)

TRACE = "tests/data/parse/cuda_decoder_trace.json"
CLOCK = "Profiling Average SM Clock(MHz)"


def _trace_with_samples(tmp_path, *, sync_us=5_000.0, split_clock=(1980.0, 1755.0), layout="old"):
    """A copy of the real trace with the sampler's sync range, and samples every 100 µs over its kernels: the
    first half of the trace at one clock, the second at another."""
    document = json.loads(open(TRACE, encoding="utf-8").read())
    events = [e for e in document["traceEvents"] if e.get("ph") == "X"]
    start, end = min(e["ts"] for e in events), max(e["ts"] + e.get("dur", 0) for e in events)
    document["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": SYNC_RANGE, "pid": 1, "tid": 1,
                                    "ts": start, "dur": 1.0, "args": {}})
    kernel_starts = sorted(e["ts"] for e in events if e.get("cat") == "kernel")
    middle = kernel_starts[len(kernel_starts) // 2]      # half the kernels before, half after
    offset = sync_us - start
    samples, t = [], start
    while t <= end:
        clock = split_clock[0] if t < middle else split_clock[1]
        samples.append([t + offset, clock, 650.0 if t < middle else 700.0, 60.0]
                       + ([600.0 if t < middle else 900.0, 0x1 if t < middle else 0x4] if layout == "new" else []))
        t += 100.0
    directory = tmp_path / "profile"
    directory.mkdir()
    (directory / "trace.json").write_text(json.dumps(document))
    (directory / POWER_SAMPLES).write_text(json.dumps({"sync_us": sync_us, "samples": samples,
                                                       **({"fields": list(SAMPLE_FIELDS)} if layout == "new" else {})}))
    return directory / "trace.json", middle


def _kernel_spans(trace_path):
    """(start, end) of each op's kernels, from the trace itself (correlation → launching op is the parse's)."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    return [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel"]


@pytest.mark.parametrize("layout", ["old", "new"], ids=["samples-before-2026-11-28", "instant-power-and-reasons"])
def test_each_row_gets_the_clock_its_kernels_ran_at(tmp_path, layout):
    """Samples files name their fields since 2026-11-28 (instantaneous power and clock-event reasons added); the
    older ones, which do not, are read as (t, clock, W, C), and their rows get no instantaneous power."""
    trace, middle = _trace_with_samples(tmp_path, layout=layout)
    out = tmp_path / "parsed"
    done = subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", str(trace),
                           "--database-path", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "power state joined from power_samples.json" in done.stderr
    kernels = _kernel_spans(trace)
    assert any(s < middle for s, _ in kernels) and any(s > middle for s, _ in kernels)
    clocks = set()
    for path in out.glob("*.csv"):
        frame = read_database_csv(path)
        assert CLOCK in frame.columns and "Profiling Average Power(W)" in frame.columns, path.name
        assert ("Profiling Average Instant Power(W)" in frame.columns) == (layout == "new"), path.name
        if layout == "new":
            assert all(600.0 <= float(v) <= 900.0 for v in frame["Profiling Average Instant Power(W)"]), path.name
        values = [float(v) for v in frame[CLOCK] if v != ""]
        assert values and all(1755.0 <= v <= 1980.0 for v in values), path.name
        clocks |= set(values)
    # Rows whose calls all ran in one half carry that half's clock exactly; a row with calls in both, a mean.
    assert {1980.0, 1755.0} <= clocks


def test_no_samples_no_columns(tmp_path):
    out = tmp_path / "parsed"
    subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", TRACE,
                    "--database-path", str(out)], check=True, capture_output=True)
    assert all(CLOCK not in read_database_csv(p).columns for p in out.glob("*.csv"))


def test_a_kernel_far_from_every_sample_gets_no_value():
    samples = PowerSamples([0.0, 100.0], [(1980.0, 600.0, 50.0), (1755.0, 700.0, 60.0)], offset_us=0.0)
    assert samples.at(40.0, 50.0) == (1980.0, 600.0, 50.0)
    assert samples.at(90.0, 100.0) == (1755.0, 700.0, 60.0)
    assert samples.at(10_000_000.0, 10_000_001.0) is None


@pytest.mark.parametrize("missing", ["sync", "samples"])
def test_samples_without_sync_are_not_joined(tmp_path, missing):
    trace, _ = _trace_with_samples(tmp_path)
    path = trace.parent / POWER_SAMPLES
    document = json.loads(path.read_text())
    document["sync_us" if missing == "sync" else "samples"] = None if missing == "sync" else []
    path.write_text(json.dumps(document))
    out = tmp_path / "parsed"
    subprocess.run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path", str(trace),
                    "--database-path", str(out)], check=True, capture_output=True)
    assert all(CLOCK not in read_database_csv(p).columns for p in out.glob("*.csv"))


def test_nvml_samples_the_gpu_torch_means_under_cuda_visible_devices(monkeypatch):
    from opperf.workload.power import nvml_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")       # a job confined to its device slot
    assert [nvml_index(0), nvml_index(1)] == [3, 1]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert nvml_index(2) == 2


def test_a_replay_window_gets_the_median_of_its_samples_else_the_nearest_one():
    """The replay's per-row power state: the samples inside the timed window, or the nearest within MAX_GAP_US
    (bisected: a persistent server's samplers hold hundreds of thousands)."""
    from opperf.power_samples import MAX_GAP_US
    from opperf.workload.power import NvmlSampler

    sampler = NvmlSampler(samples=[(t * 2_000.0, 1_980.0 - t, 500.0 + t, 50.0) for t in range(200_000)])
    assert sampler.state_during(10_000.0, 18_000.0) == (1_973.0, 507.0)       # samples 5..9: the median is 7
    assert sampler.state_during(10_500.0, 10_600.0) == (1_975.0, 505.0)       # none inside: the nearest (5)
    last = sampler.samples[-1][0]
    assert sampler.state_during(last + MAX_GAP_US / 2, last + MAX_GAP_US / 2) == (1_980.0 - 199_999, 500.0 + 199_999)
    assert sampler.state_during(last + 3 * MAX_GAP_US, last + 3 * MAX_GAP_US) is None
    assert NvmlSampler().state_during(0.0, 1.0) is None
    NvmlSampler().stop()                                                         # never started: nothing to join


def test_a_replay_job_closes_its_timer(tmp_path, monkeypatch):
    """A persistent server runs many jobs in one process: each job's timer must end what it started (the cuda
    timer's NVML sampler), or every job leaves a thread polling at 500 Hz and the later jobs slow down 4-7x."""
    from opperf.replay import timing, worker

    closed = []

    def make_and_watch(*args, **kwargs):
        timer = make_timer(*args, **kwargs)
        close = timer.close
        timer.close = lambda: (closed.append(type(timer).__name__), close())
        return timer

    make_timer = timing.make_timer
    monkeypatch.setattr(timing, "make_timer", make_and_watch)
    (tmp_path / "indices").write_text("0\n")
    arguments = ["--rows", "tests/data/database/cpu_replayed/add.csv", "--kernel", "add",
                 "--definition", "config/kernels/torch/add.yaml", "--backend", "cpu",
                 "--indices", str(tmp_path / "indices"), "--progress", str(tmp_path / "progress"),
                 "--repeat-count", "3", "--warmup-count", "1"]
    assert worker.main(arguments) == 0
    with pytest.raises(FileNotFoundError):                       # a job that breaks closes its timer too
        worker.main([*arguments, "--indices", str(tmp_path / "missing")])
    assert closed == ["CpuProfilerTimer", "CpuProfilerTimer"]
    outcomes = [json.loads(line) for line in (tmp_path / "progress").read_text().splitlines()]
    assert [o["outcome"]["status"] for o in outcomes if o.get("event") == "done"][0] == "ok"


def test_each_call_gets_how_long_the_gpu_idled_before_it():
    """The real H100 trace of a tiny Qwen2-MoE: its rotary embedding's cat ran after the GPU had idled 163.876 µs
    (prefill) and 197.509 µs (decode) behind the host."""
    from opperf import contract
    from opperf.parse.torch_trace import convert_trace
    from opperf.power_samples import IDLE_BEFORE

    trace = "tests/data/parse/cuda_tiny_qwen2_moe/trace.json.gz"
    calls = {r[contract.INPUT_SHAPES]: r[IDLE_BEFORE] for r in convert_trace(trace).rows if r["Name"] == "aten::cat"}
    assert (calls["1,24,8;1,24,8;"], calls["1,1,8;1,1,8;"]) == (163.876, 197.509)
    assert contract.profiling_counter_column(IDLE_BEFORE) == contract.PROFILED_IDLE_BEFORE
    # The parsed row's mean: tests/test_input_values.py parses this trace once for its module.


def test_clock_event_reasons_are_shared_over_the_throttled_samples_only():
    # (t, clock, W, C, mask): two full-clock samples (idle), three throttled: power cap twice, once with the HW
    # slowdown as well, once no reason at all.
    samples = [(0, 1980.0, 80.0, 35.0, 70.0, 0x1), (1, 1975.0, 90.0, 35.0, 95.0, 0x1),
               (2, 1755.0, 690.0, 60.0, 720.0, 0x4), (3, 1700.0, 700.0, 61.0, 760.0, 0x4 | 0x8),
               (4, 1800.0, 400.0, 45.0, 300.0, 0x0)]
    shares = reason_shares(samples, max_clock=1980.0)
    assert shares["samples"] == 5 and shares["throttled_samples"] == 3 and shares["full_clock_mhz"] == 1980.0
    assert shares["reasons"] == pytest.approx({"sw_power_cap": 2 / 3, "hw_slowdown": 1 / 3, "none": 1 / 3})
    assert list(shares["reasons"])[0] == "sw_power_cap"                          # most frequent first
    assert reason_names(0x4 | 0x80 | 0x10000) == ["sw_power_cap", "hw_power_brake_slowdown", "0x10000"]
    # Samples of a sampler before the masks, or masks the driver did not give: nothing to say.
    assert reason_shares([s[:4] for s in samples]) is None
    assert reason_shares([(*s[:5], None) for s in samples]) is None
    # The first layout of 2026-11-28 (no instantaneous power), read by its fields.
    first = ("t_us", "SM Clock(MHz)", "Power(W)", "Temperature(C)", "clock_event_reasons")
    assert reason_shares([(*s[:4], s[5]) for s in samples], 1980.0, first) == shares
    # Without the device's maximum, the highest sampled clock is the full one.
    assert reason_shares(samples)["throttled_samples"] == 3
