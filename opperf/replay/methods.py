"""How replay measures, in words and numbers every process can read (no torch import).

The job's parent process validates options and writes back results without torch; the child's
timers (`opperf.replay.timing`) implement what is named here. One module for both keeps the engine
and the timers free of an import cycle.

The cache state (what the device cache holds when a timed call starts, cuda and npu): `insitu`. The cache is
flushed, then the inputs the workload had just written (activations: the definition's `cache: warm` slots, the
default, or by the workload's reuse distances) are written back into it, while weights and tables (`cache: cold`)
stay in memory. On an H100 this replayed two workloads at 2.3 / 9.8 / 4.3 % (median / p90 / time-weighted gap),
against 10.1 / 40.5 / 5.2 % with everything cold (flush) and 7.9 / 24.8 / 6.7 % with everything warm
(benchmarks/results/cuda_replay/); rewriting a warm input from a twin rather than in place lowered the median gap on
every unseen workload (benchmarks/results/insitu_copy/).
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

CACHE_POLICY = "insitu"

METHOD_CPU_PROFILER = "cpu profiler (torch.profiler, record_shapes) op wall time per call"
# benchmarks/results/cpu_replay: median gap 40.0 % (wall clock around the Python call) -> 27.5 % (the op's profiler time)
METHOD_CUDA_KERNEL = "cuda profiler (CUPTI) device-kernel time per call"
METHOD_SESSION = "device profiler session (msprof)"
# The GPU's power state around each timed call (cuda), `after-gemm`: a call of 0.2 ms or more is followed by as much
# idle as it took (the clock recovers, as between a workload's lighter kernels), and a shorter call gets one heater
# GEMM before it, as inside a model, where short kernels run between GEMMs (benchmarks/results/small_kernels/: kernels
# under 30 µs ran 6 % faster in replay than in the workload right behind the cache preparation, 2 % after a GEMM;
# benchmarks/results/cuda_replay_transformers/after_gemm/: the median gap of five workloads fell against the idle
# alone, on the two unseen ones 4.2 -> 3.6 % and 3.3 -> 2.9 %; docs/replay.md, "Power state"). Holding the workload's
# SM clock (match-clock: same profile on the development dense decoder only, p90 10.7 -> 11.1 %, too slow to finish
# Mixtral), replaying the workload's GEMM history before long calls (after-long-gemm: Mixtral within the replay's
# noise; gemm-history: one development profile) and keeping the GPU in the phase (phase-history: heated rows
# 1.06-1.23x) were measured and removed (benchmarks/results/cuda_replay_reuse/h100_policy_ab/, h100_match_clock/,
# gemm_state/, power_phase/); stage 4b replays the workload's own order instead (opperf.replay.phase).
POWER_POLICY = "after-gemm"

# after-gemm's heater is for a GPU the workload kept busy; no short call the workload ran under this power gets one
# (--heater-min-power). Measured on every profiled chain (benchmarks/results/heater_ab/, dev_gates_reuse/): the
# reference MoE's expert loop runs at 134-174 W and replays 1.09x with the heater, 0.99x without; every other
# workload's short calls (dense, Phi-3-mini, DeepSeek-V2-Lite, OLMoE, Qwen2-MoE, Mixtral; H100 and H200) ran at
# 189 W and more, where the heater takes them from 0.96-0.97x to 1.00x. No row of theirs lies under 180 W.
DEFAULT_HEATER_MIN_POWER_W = 180.0

# Rows whose timed calls share one profiler session (cuda and cpu): the session's start, stop and parse are paid once
# per batch, not per row; a crash loses at most one batch's measurements (re-run).
TIMING_BATCH_ROWS = 128

# --time-budget-s (off by default: every row gets --repeat-count timed calls).
DEFAULT_MIN_REPEAT_COUNT = 3
STOP_BUDGET, STOP_MAXIMUM = "time budget", "maximum"


def _duration_text(duration_us: float) -> str:
    if duration_us >= 1e6:
        return f"{duration_us / 1e6:.3g} s"
    return f"{duration_us / 1000:.3g} ms" if duration_us >= 1000 else f"{duration_us:.3g} us"


@dataclass(frozen=True)
class RepeatBudget:
    """How many timed calls a row gets when a time budget chooses (--time-budget-s), instead of --repeat-count each.

    After `min_count` calls a row stops once its calls have taken `time_budget_s`, and at --repeat-count calls at
    the latest: a 0.6 s GEMM stops after the minimum, a 2 us op runs to the maximum. A timer that sees each call's
    wall time as it goes (cpu) decides after each call (`stop_reason`); one whose calls run queued ahead of the host
    (cuda) sets the count before the first timed call from the time of a warm-up call (`planned_count`). `note` is
    what the row records, after its `Replay Timing Method`: the count, what stopped it and the bounds.
    """

    time_budget_s: float
    min_count: int = DEFAULT_MIN_REPEAT_COUNT

    def stop_reason(self, calls: int, max_count: int, spent_us: float) -> str | None:
        """Why a row stops after `calls` timed calls that took `spent_us`, or None to go on."""
        if calls >= max_count:
            return STOP_MAXIMUM
        if calls < self.min_count:
            return None
        if spent_us >= self.time_budget_s * 1e6:
            return STOP_BUDGET
        return None

    def planned_count(self, call_us: float, max_count: int) -> tuple[int, str]:
        """(timed calls, why) for a row whose calls take about `call_us` each: as many as the budget holds, within
        the bounds."""
        fits = math.ceil(self.time_budget_s * 1e6 / call_us) if call_us > 0 else max_count
        if fits >= max_count:
            return max_count, STOP_MAXIMUM
        return min(max(fits, self.min_count), max_count), STOP_BUDGET

    def note(self, calls: int, reason: str, max_count: int, *, spent_us: float | None = None,
             call_us: float | None = None) -> str:
        """The row's record of its repetitions, e.g. `12 timed calls, stopped by the time budget: 10.4 ms of 10 ms
        spent (min 3, max 30)`; `call_us`: the warm-up's time per call a planned count came from."""
        budget = _duration_text(self.time_budget_s * 1e6)
        if call_us is not None:
            spent = f"{budget} at {_duration_text(call_us)} per call in the warm-up"
            verb = "set"
        else:
            spent = f"{_duration_text(spent_us or 0.0)} of {budget} spent"
            verb = "stopped"
        detail = spent if reason == STOP_BUDGET or call_us is None else f"time budget {spent}"
        return f"{calls} timed calls, {verb} by the {reason}: {detail} (min {self.min_count}, max {max_count})"


@dataclass
class TimingResult:
    """The per-call samples of one case (microseconds) and how they were taken."""

    samples_us: list[float]
    method: str
    l2_policy: str
    other_samples_us: dict[str, list[float]] = field(default_factory=dict)   # e.g. CUDA-event samples
    power_state: tuple[float, float] | None = None     # (SM clock MHz, power W) while the calls ran (cuda, NVML)
    repetitions: str = ""      # how many timed calls and why, where a RepeatBudget chose them (RepeatBudget.note)


class Timer(Protocol):
    """Times cases; a batching timer may return the samples only at `collect()`.

    `measure(case, warmup_count, repeat_count, key)` runs the warm-up and timed calls of one case
    (a `opperf.replay.inputs.ReplayCase`) and keeps what it needs to attribute samples to `key`; with
    `budget=` (a RepeatBudget) `repeat_count` is the most timed calls, the budget chooses how many;
    `collect()` returns every key measured since the last collect with its TimingResult (an empty
    sample list means an outer session times the calls: npu). `close()` ends what the timer keeps running (the
    cuda timer's NVML sampler thread): a persistent replay server makes one timer per job, and each one left
    polling burdens every later job.
    """

    backend: str

    def measure(self, case: Any, warmup_count: int, repeat_count: int, key: Hashable, *,
                budget: RepeatBudget | None = None) -> None: ...

    def collect(self) -> dict[Hashable, TimingResult]: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...
