"""Timers: how one replay case's calls are measured on each back end.

- cpu: wall clock (`time.perf_counter_ns`) around each call.
- cuda: per call, the device-kernel time the profiler (CUPTI) attributes to the call, and the
  CUDA-event time around it; the L2 policy is explicit and recorded (`flush`: overwrite a buffer of
  twice the L2 size before each call; `rotate`: cycle through enough input copies that the working
  set exceeds twice the L2; `none`: warm L2).
- npu: the calls run here, the timing comes from the msprof session around the whole process
  (`opperf.replay.npu`), so this timer only executes them (`SessionExecutionTimer`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from opperf.errors import DeviceUnavailableError, OpperfError
from opperf.replay.engine import L2_POLICIES
from opperf.replay.inputs import ReplayCase

METHOD_CPU_WALL = "cpu wall clock (perf_counter_ns) per call"
METHOD_CUDA_KERNEL = "cuda profiler (CUPTI) device-kernel time per call"
METHOD_CUDA_EVENT = "cuda events per call"
METHOD_SESSION = "device profiler session (msprof)"


@dataclass
class TimingResult:
    """The per-call samples of one case (microseconds) and how they were taken."""

    samples_us: list[float]
    method: str
    l2_policy: str
    other_samples_us: dict[str, list[float]] = field(default_factory=dict)   # e.g. CUDA-event samples


class Timer(Protocol):
    backend: str

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int) -> TimingResult: ...

    def synchronize(self) -> None: ...


class CpuWallClockTimer:
    """Wall clock around each call on the host CPU (the L2/L3 is left warm: recorded as `none`).

    `threads`: torch's intra-op thread count for the replay (None: torch's default); recorded in the
    timing method, since a CPU kernel's time depends on it.
    """

    backend = "cpu"

    def __init__(self, threads: int | None = None):
        if threads is not None:
            if threads < 1:
                raise OpperfError(f"must be >= 1, got {threads}", field="--cpu-threads")
            torch.set_num_threads(threads)
        self.method = f"{METHOD_CPU_WALL}, {torch.get_num_threads()} threads"

    def synchronize(self) -> None:
        return None

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int) -> TimingResult:
        for _ in range(warmup_count):
            case.run()
        samples = []
        clock = time.perf_counter_ns
        for _ in range(repeat_count):
            start = clock()
            case.run()
            samples.append((clock() - start) / 1000.0)
        return TimingResult(samples, self.method, "none")


def _clone_case(case: ReplayCase) -> ReplayCase:
    """A copy of the case with fresh tensor inputs (for L2 input rotation)."""
    def clone(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, (list, tuple)):
            return type(value)(clone(v) for v in value)
        return value
    return ReplayCase(fn=case.fn, args=tuple(clone(a) for a in case.args),
                      kwargs={k: clone(v) for k, v in case.kwargs.items()}, description=case.description)


def _tensor_bytes(case: ReplayCase) -> int:
    total = 0
    for value in (*case.args, *case.kwargs.values()):
        items = value if isinstance(value, (list, tuple)) else [value]
        total += sum(t.numel() * t.element_size() for t in items if isinstance(t, torch.Tensor))
    return total


class CudaTimer:
    """Device-kernel time (CUPTI via torch.profiler) and CUDA-event time per call, under an explicit L2 policy.

    Each profiled call runs inside a `record_function` range; the profiler attributes every kernel
    launched within it to that range, so the range's device time is the call's kernel time. The
    L2 flush runs outside the range and outside the events. Validated on an H200 with
    benchmarks/cuda_replay_check.py (results in benchmarks/results/cuda_replay_check.txt).
    """

    backend = "cuda"
    RANGE_NAME = "opperf_replay_call"
    MAX_ROTATION_COPIES = 64

    def __init__(self, device: str | torch.device = "cuda", l2_policy: str = "flush", primary: str = "kernel"):
        if not torch.cuda.is_available():
            raise DeviceUnavailableError("back end cuda asked for, but torch.cuda.is_available() is False "
                                         f"(torch {torch.__version__}, CUDA build {torch.version.cuda})")
        if l2_policy not in L2_POLICIES:
            raise OpperfError(f"L2 policy {l2_policy!r} is not one of {L2_POLICIES}", field="l2_policy")
        if primary not in ("kernel", "event"):
            raise OpperfError(f"primary timing {primary!r} is not kernel or event", field="cuda_timing")
        self.device = torch.device(device)
        self.l2_policy = l2_policy
        self.primary = primary
        self.l2_bytes = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        self._flush_buffer = None

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def _flush(self) -> None:
        if self._flush_buffer is None:
            self._flush_buffer = torch.empty(2 * self.l2_bytes, dtype=torch.int8, device=self.device)
        self._flush_buffer.zero_()

    def _cases_for_policy(self, case: ReplayCase) -> tuple[list[ReplayCase], str]:
        if self.l2_policy == "rotate":
            per_copy = max(_tensor_bytes(case), 1)
            copies = min(self.MAX_ROTATION_COPIES, max(1, -(-2 * self.l2_bytes // per_copy)))
            cases = [case] + [_clone_case(case) for _ in range(copies - 1)]
            return cases, f"rotate x{copies} input copies (L2 {self.l2_bytes // 1024} KiB)"
        if self.l2_policy == "flush":
            return [case], f"flush {2 * self.l2_bytes // (1024 * 1024)} MiB before each call (L2 {self.l2_bytes // 1024} KiB)"
        return [case], "none (warm L2)"

    def _prepare(self, case: ReplayCase, index: int, cases: list[ReplayCase]) -> ReplayCase:
        if self.l2_policy == "flush":
            self._flush()
        return cases[index % len(cases)]

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int) -> TimingResult:
        """Two passes of `repeat_count` calls: CUDA events alone, then the profiler alone.

        Separate passes keep each clean: the profiler's launch instrumentation would inflate event
        times of short kernels, and events add nothing to the kernel ranges.
        """
        from torch.profiler import ProfilerActivity, profile, record_function

        cases, policy = self._cases_for_policy(case)
        for index in range(warmup_count):
            cases[index % len(cases)].run()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat_count)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat_count)]
        self.synchronize()
        for index in range(repeat_count):
            current = self._prepare(case, index, cases)
            starts[index].record()
            current.run()
            ends[index].record()
        self.synchronize()
        event_us = [start.elapsed_time(end) * 1000.0 for start, end in zip(starts, ends)]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for index in range(repeat_count):
                current = self._prepare(case, index, cases)
                with record_function(self.RANGE_NAME):
                    current.run()
            self.synchronize()
        kernel_us = [evt.device_time_total for evt in prof.events()
                     if evt.name == self.RANGE_NAME and evt.device_type == torch.autograd.DeviceType.CPU]
        if len(kernel_us) != repeat_count:
            raise OpperfError(f"the profiler reported {len(kernel_us)} call ranges for {repeat_count} calls")
        if self.primary == "kernel":
            return TimingResult(kernel_us, METHOD_CUDA_KERNEL, policy, {METHOD_CUDA_EVENT: event_us})
        return TimingResult(event_us, METHOD_CUDA_EVENT, policy, {METHOD_CUDA_KERNEL: kernel_us})


class SessionExecutionTimer:
    """Runs the calls for a profiler session that wraps the whole process (msprof); takes no samples here."""

    backend = "npu"

    def __init__(self, synchronize=None):
        self._synchronize = synchronize

    def synchronize(self) -> None:
        if self._synchronize is not None:
            self._synchronize()

    def measure(self, case: ReplayCase, warmup_count: int, repeat_count: int) -> TimingResult:
        for _ in range(warmup_count + repeat_count):
            case.run()
        self.synchronize()
        return TimingResult([], METHOD_SESSION, "none")


def make_timer(backend: str, *, device: str | None = None, l2_policy: str = "flush",
               cuda_primary: str = "kernel", cpu_threads: int | None = None) -> Timer:
    """The timer of a back end (npu: execution only; its durations come from the msprof session)."""
    if backend == "cpu":
        return CpuWallClockTimer(cpu_threads)
    if backend == "cuda":
        return CudaTimer(device or "cuda", l2_policy=l2_policy, primary=cuda_primary)
    if backend == "npu":
        def synchronize():
            torch.npu.synchronize()     # torch_npu registers torch.npu on import
        return SessionExecutionTimer(synchronize)
    raise OpperfError(f"unknown back end {backend!r} (expected cpu, cuda or npu)", field="--backend")


def device_for(backend: str) -> str:
    """The torch device string replay tensors are built on."""
    return {"cpu": "cpu", "cuda": "cuda", "npu": "npu"}[backend]
