"""Timers for the collective benchmarks, one per (back end, bench mode).

`event` mode is the time the caller sees per call: the host wall clock around each (synchronous) gloo
call; on CUDA/NPU, device events recorded between back-to-back calls on the stream. `kernel` mode is the
device-kernel time the profiler records: CUDA kernels whose name contains `nccl` (torch.profiler), or on
NPU the `hcom_*` rows of torch_npu's kernel_details.csv without the `AivKernel` duplicates (what
step_trace's Communication sums). Every timer returns, per case, this rank's per-call durations in µs.
A case runs `preroll` untimed calls first (re-warming after the cases before it).
"""

from __future__ import annotations

import csv
import json
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.comm.collectives import collective
from opperf.errors import DeviceUnavailableError, OpperfError

BENCH_MODES = ("event", "kernel")


@dataclass
class TimedCase:
    """A prepared case (anything with `run()` and `op`) and how many calls to time after `preroll`."""
    case: object
    iterations: int
    preroll: int = 1


class Timer:
    timing_method = ""

    def __init__(self, synchronize: Callable[[], None], barrier: Callable[[], None]):
        self.synchronize = synchronize      # waits for this rank's device work
        self.barrier = barrier              # host-side barrier of the group (no device kernels)

    def _start(self, timed: TimedCase) -> None:
        self.synchronize()
        self.barrier()
        for _ in range(timed.preroll):
            timed.case.run()

    def time_cases(self, cases: Sequence[TimedCase]) -> list[list[float]]:
        raise NotImplementedError


class HostClockTimer(Timer):
    """gloo (CPU): collectives are synchronous, so the wall clock around each call is its duration."""
    timing_method = "host_wall_clock"

    def time_cases(self, cases):
        results = []
        for timed in cases:
            self._start(timed)
            samples = []
            for _ in range(timed.iterations):
                start = time.perf_counter()
                timed.case.run()
                samples.append((time.perf_counter() - start) * 1e6)
            results.append(samples)
        return results


class DeviceEventTimer(Timer):
    """CUDA/NPU: events between back-to-back calls on the stream (call i = event i → event i+1)."""

    def __init__(self, event_factory: Callable[[], object], synchronize, barrier, method: str):
        super().__init__(synchronize, barrier)
        self.event_factory = event_factory
        self.timing_method = method

    def time_cases(self, cases):
        results = []
        for timed in cases:
            self._start(timed)
            events = [self.event_factory() for _ in range(timed.iterations + 1)]
            events[0].record()
            for event in events[1:]:
                timed.case.run()
                event.record()
            self.synchronize()
            results.append([events[i].elapsed_time(events[i + 1]) * 1e3 for i in range(timed.iterations)])
        return results


def split_kernel_durations(durations_us: Sequence[float], cases: Sequence[TimedCase], source: str) -> list[list[float]]:
    """Per-case, per-call kernel time from the profiler's kernels in launch order.

    Every call must have launched the same number k of kernels; the preroll calls' kernels are dropped.
    """
    calls = sum(t.preroll + t.iterations for t in cases)
    if calls == 0 or len(durations_us) % calls:
        raise OpperfError(f"{source}: found {len(durations_us)} collective kernels for {calls} calls; "
                          "cannot attribute kernels to calls (another collective ran inside the session?)")
    per_call = len(durations_us) // calls
    if per_call == 0:
        raise OpperfError(f"{source}: the profiler recorded no collective kernels")
    results, position = [], 0
    for timed in cases:
        position += timed.preroll * per_call
        samples = []
        for _ in range(timed.iterations):
            samples.append(math.fsum(durations_us[position:position + per_call]))
            position += per_call
        results.append(samples)
    return results


def cuda_kernel_durations(trace_path: str | Path) -> list[float]:
    """Durations (µs) of the NCCL kernels in a torch.profiler Chrome trace, in start order."""
    trace_path = Path(trace_path)
    try:
        events = json.loads(trace_path.read_text(encoding="utf-8")).get("traceEvents", [])
    except (OSError, json.JSONDecodeError) as exc:
        raise OpperfError(f"cannot read profiler trace: {exc}", path=trace_path) from exc
    kernels = [e for e in events if e.get("cat") == "kernel" and "nccl" in str(e.get("name", "")).lower()]
    kernels.sort(key=lambda e: float(e["ts"]))
    return [float(e["dur"]) for e in kernels]


class CudaKernelTimer(Timer):
    """CUDA: one torch.profiler session over all cases; NCCL kernel time per call."""
    timing_method = "cuda_profiler_kernel"

    def time_cases(self, cases):
        import torch
        from torch.profiler import ProfilerActivity, profile

        with tempfile.TemporaryDirectory(prefix="opperf_comm_") as tmp:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for timed in cases:
                    self._start(timed)
                    for _ in range(timed.iterations):
                        timed.case.run()
                    self.synchronize()
            trace = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(trace))
            durations = cuda_kernel_durations(trace)
        torch.cuda.synchronize()
        return split_kernel_durations(durations, cases, "torch.profiler CUDA trace")


def hccl_kernel_durations(kernel_details: str | Path, kernel_type: str) -> list[float]:
    """Durations (µs) of one collective's rows in torch_npu's kernel_details.csv, in start order.

    Rows whose Type starts with the op's `hcom_*_` type count; each HCCL op also appears as an
    `AivKernel` row on the HCCL stream, which is dropped (same time, counted once).
    """
    path = Path(kernel_details)
    rows = []
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        header = [c.strip() for c in (reader.fieldnames or [])]
        for needed in ("Name", "Type", "Duration(us)"):
            if needed not in header:
                raise OpperfError(f"missing column {needed!r}", path=path, field=needed)
        for line, raw in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            if not row["Type"].startswith(kernel_type) or "AivKernel" in row["Name"]:
                continue
            duration = _number(row["Duration(us)"], path, line, "Duration(us)")
            start = _number(row["Start Time(us)"], path, line, "Start Time(us)") if row.get("Start Time(us)") else line
            if duration > 0:
                rows.append((start, duration))
    rows.sort()
    return [duration for _, duration in rows]


def _number(text: str, path: Path, line: int, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise OpperfError(f"not a number: {text!r}", path=path, row=line, field=field) from None


class NpuKernelTimer(Timer):
    """NPU: one torch_npu.profiler session over all cases (CANN's profiler cannot be restarted reliably
    in one process), then the op's hcom_* rows of kernel_details.csv."""
    timing_method = "npu_profiler_kernel_details"

    def __init__(self, op: str, synchronize, barrier):
        super().__init__(synchronize, barrier)
        self.kernel_type = collective(op).hccl_kernel_type

    def time_cases(self, cases):
        import torch_npu

        with tempfile.TemporaryDirectory(prefix="opperf_comm_npu_") as tmp:
            config = torch_npu.profiler._ExperimentalConfig(
                profiler_level=torch_npu.profiler.ProfilerLevel.Level1, l2_cache=False,
                data_simplification=True)
            with torch_npu.profiler.profile(
                    activities=[torch_npu.profiler.ProfilerActivity.CPU, torch_npu.profiler.ProfilerActivity.NPU],
                    on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(tmp),
                    experimental_config=config):
                for timed in cases:
                    self._start(timed)
                    for _ in range(timed.iterations):
                        timed.case.run()
                    self.synchronize()
            found = sorted(Path(tmp).rglob("kernel_details.csv"))
            if not found:
                raise OpperfError(f"torch_npu.profiler wrote no kernel_details.csv under {tmp}")
            durations = hccl_kernel_durations(found[0], self.kernel_type)
        return split_kernel_durations(durations, cases, f"kernel_details.csv {self.kernel_type} rows")


def device_synchronizer(backend: str) -> Callable[[], None]:
    """What waits for this rank's device work; nothing on gloo, whose calls return when they are done."""
    if backend == "gloo":
        return lambda: None
    if backend == "nccl":
        import torch

        return torch.cuda.synchronize
    if backend == "hccl":
        try:
            import torch
            import torch_npu  # noqa: F401
        except ImportError as exc:
            raise DeviceUnavailableError("the hccl back end needs torch_npu (Ascend NPU), which is not "
                                         f"installed here: {exc}") from exc
        return torch.npu.synchronize
    raise OpperfError(f"unknown back end {backend!r}", field="--backend")


def make_timer(backend: str, bench_mode: str, op: str, barrier: Callable[[], None]) -> Timer:
    """The timer of a back end and mode; what a back end cannot time is an error that says so."""
    if bench_mode not in BENCH_MODES:
        raise OpperfError(f"unknown bench mode {bench_mode!r} (choose from {', '.join(BENCH_MODES)})",
                          field="--bench-mode")
    if backend == "gloo" and bench_mode == "kernel":
        raise OpperfError("bench mode 'kernel' reads device-kernel time, and gloo (CPU) runs no device "
                          "kernels; use --bench-mode event (host wall clock) with gloo", field="--bench-mode")
    sync = device_synchronizer(backend)
    if backend == "gloo":
        return HostClockTimer(sync, barrier)
    import torch

    if backend == "nccl":
        if bench_mode == "kernel":
            return CudaKernelTimer(sync, barrier)
        return DeviceEventTimer(lambda: torch.cuda.Event(enable_timing=True), sync, barrier, "cuda_event")
    if bench_mode == "kernel":
        return NpuKernelTimer(op, sync, barrier)
    return DeviceEventTimer(lambda: torch.npu.Event(enable_timing=True), sync, barrier, "npu_event")
