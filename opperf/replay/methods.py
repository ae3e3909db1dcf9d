"""How replay measures, in words and numbers every process can read (no torch import).

The job's parent process validates options and writes back results without torch; the child's
timers (`opperf.replay.timing`) implement what is named here. One module for both keeps the engine
and the timers free of an import cycle.

Cache policies (what the device cache holds when a timed call starts):
- `insitu` (default): the state the kernel meets inside the model. The cache is flushed, then the
  inputs the workload had just written (activations: the definition's `cache: warm` slots, the
  default) are written back into it, while weights and tables (`cache: cold`) stay in memory.
- `flush`: everything cold (a buffer of twice the cache size overwritten before each call).
- `rotate`: everything cold by cycling through enough input copies to exceed twice the cache.
- `none`: everything warm from the previous call.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from opperf.power_samples import POWER_DRAWING_OPS, op_base_name
from opperf.stats import split_interrupted

CACHE_POLICIES = ("insitu", "insitu-inplace", "flush", "rotate", "none")
DEFAULT_CACHE_POLICY = "insitu"

METHOD_CPU_WALL = "cpu wall clock (perf_counter_ns) per call"
METHOD_CPU_PROFILER = "cpu profiler (torch.profiler, record_shapes) op wall time per call"
CPU_TIMINGS = ("wall", "profiler")
DEFAULT_CPU_TIMING = "profiler"      # benchmarks/results/cpu_replay: median gap 42.9 % (wall) -> 28.5 %
METHOD_CUDA_KERNEL = "cuda profiler (CUPTI) device-kernel time per call"
METHOD_CUDA_EVENT = "cuda events per call"
METHOD_SESSION = "device profiler session (msprof)"
CUDA_TIMINGS = ("kernel", "event")
# The GPU's power state around each timed call (cuda): `cooldown` idles after a long call as long as it took
# (the clock recovers, as between a workload's lighter kernels); `match-clock` holds the SM clock down to the
# one the row's kernels ran at in the workload (Profiling Average SM Clock(MHz)) with heater GEMMs before each
# call, for every row the workload ran throttled except long GEMM/attention calls (they set their own clock:
# `sets_own_clock`), and treats the others as `after-gemm`; `after-gemm` (default) is `cooldown` plus one heater
# GEMM before each shorter call, as inside a model, where short kernels run between GEMMs
# (benchmarks/results/small_kernels/: kernels under 30 µs ran 6 % faster in replay than in the workload right behind
# the cache preparation, 2 % after a GEMM; docs/replay.md, "Power state").
# benchmarks/results/cuda_power_state/ measures the state workloads run in and what each policy does; holding only
# the long calls at their clock was measured and dropped (benchmarks/results/cuda_replay_reuse/h100_policy_ab/).
# `after-long-gemm` is after-gemm, except that a long call (not a GEMM or attention call) follows a GEMM block as
# long as the workload's GEMM history before it amounts to (its trace's `Equivalent GEMM Before(us)`).
# `gemm-history` is after-long-gemm for every long call, GEMM and attention calls included: the 64k-token prefill's
# GEMMs ran 4-7 % slower in the workload than one at a time (benchmarks/results/gemm_state/).
# `phase-history` is after-long-gemm with the GPU kept in the phase: heater GEMMs for PHASE_PREHEAT_S before the
# row's first call and, before each call, its GEMM history, with no idle between the calls. The workload runs a long
# prefill without a pause and an elementwise call in it inherits the power-cap state the phase built: on an H200 the
# prefill's `act * up` took 0.88 of its profiled time after equal idle, 0.91 after its history and 100 ms of rest
# (gemm-history), 0.95-0.98 after 20-50 ms of GEMMs with no rest (benchmarks/results/power_phase/). Not the default:
# on the dense decoder's H100 profile it took the prefill's silu and mul to 1.00 and every other heated row to
# 1.06-1.23 (the same results; benchmarks/phase_replay.py, the workload's own sequence, reproduced all of them).
POWER_POLICIES = ("cooldown", "match-clock", "after-gemm", "after-long-gemm", "gemm-history", "phase-history")
GEMM_HISTORY_POLICIES = frozenset({"after-long-gemm", "gemm-history", "phase-history"})
PHASE_PREHEAT_S = 0.4
# Definition categories whose long calls draw the power that sets their own clock (schema-built ops: by name,
# opperf.power_samples.POWER_DRAWING_OPS).
SETS_OWN_CLOCK_CATEGORIES = frozenset({"matmul", "attention"})


def sets_own_clock(category: str, schema_op: str | None) -> bool:
    """Whether a long call of this recipe throttles itself (a GEMM, attention) rather than inheriting a clock."""
    return category in SETS_OWN_CLOCK_CATEGORIES or op_base_name(schema_op or "") in POWER_DRAWING_OPS


DEFAULT_POWER_POLICY = "after-gemm"
# after-gemm's heater is for a GPU the workload kept busy; no short call the workload ran under this power gets one
# (--heater-min-power). Measured on every profiled chain (benchmarks/results/heater_ab/, dev_gates_reuse/): the
# reference MoE's expert loop runs at 134-174 W and replays 1.09x with the heater, 0.99x without; every other
# workload's short calls (dense, Phi-3-mini, DeepSeek-V2-Lite, OLMoE, Qwen2-MoE, Mixtral; H100 and H200) ran at
# 189 W and more, where the heater takes them from 0.96-0.97x to 1.00x. No row of theirs lies under 180 W.
DEFAULT_HEATER_MIN_POWER_W = 180.0

# Rows whose timed calls share one profiler session (cuda kernel timing, cpu profiler timing): the session's start, stop and
# parse are paid once per batch, not per row; a crash loses at most one batch's measurements (re-run).
DEFAULT_TIMING_BATCH_ROWS = 128

# --time-budget-s (off by default: every row gets --repeat-count timed calls).
DEFAULT_MIN_REPEAT_COUNT = 3
DEFAULT_TARGET_REL_ERROR = 0.01
STOP_BUDGET, STOP_SPREAD, STOP_MAXIMUM = "time budget", "spread", "maximum"


def _duration_text(duration_us: float) -> str:
    if duration_us >= 1e6:
        return f"{duration_us / 1e6:.3g} s"
    return f"{duration_us / 1000:.3g} ms" if duration_us >= 1000 else f"{duration_us:.3g} us"


def relative_standard_error(samples_us: Sequence[float]) -> float | None:
    """The standard error of the samples' mean over the mean, the interrupted calls left out as every statistic
    leaves them out (opperf.stats.split_interrupted); None under two kept samples or a mean of 0."""
    kept = split_interrupted(samples_us)[0]
    if len(kept) < 2:
        return None
    mean = statistics.fmean(kept)
    return statistics.stdev(kept) / math.sqrt(len(kept)) / mean if mean > 0 else None


@dataclass(frozen=True)
class RepeatBudget:
    """How many timed calls a row gets when a time budget chooses (--time-budget-s), instead of --repeat-count each.

    After `min_count` calls a row stops once its calls have taken `time_budget_s`, or once the standard error of
    their mean is under `target_rel_error` of the mean (0: the spread never stops it), and at --repeat-count calls
    at the latest: a 0.6 s GEMM stops after the minimum, a 2 us op runs to the maximum unless its spread is small.
    A timer that sees each call's time as it goes (cpu) decides after each call (`stop_reason`); one whose samples
    come only after the calls ran (cuda: kernels queued ahead of the host) sets the count before the first timed
    call from the time of a warm-up call (`planned_count`), and only the budget decides it. `note` is what the row
    records, after its `Replay Timing Method`: the count, what stopped it and the bounds.
    """

    time_budget_s: float
    min_count: int = DEFAULT_MIN_REPEAT_COUNT
    target_rel_error: float = DEFAULT_TARGET_REL_ERROR

    def stop_reason(self, calls: int, max_count: int, spent_us: float,
                    samples_us: Sequence[float] | None = None) -> str | None:
        """Why a row stops after `calls` timed calls that took `spent_us` (`samples_us`: their times, where the
        timer has them as it goes), or None to go on."""
        if calls >= max_count:
            return STOP_MAXIMUM
        if calls < self.min_count:
            return None
        if spent_us >= self.time_budget_s * 1e6:
            return STOP_BUDGET
        if samples_us is not None and self.target_rel_error > 0:
            error = relative_standard_error(samples_us)
            if error is not None and error <= self.target_rel_error:
                return STOP_SPREAD
        return None

    def planned_count(self, call_us: float, max_count: int) -> tuple[int, str]:
        """(timed calls, why) for a row whose calls take about `call_us` each: as many as the budget holds, within
        the bounds."""
        fits = math.ceil(self.time_budget_s * 1e6 / call_us) if call_us > 0 else max_count
        if fits >= max_count:
            return max_count, STOP_MAXIMUM
        return min(max(fits, self.min_count), max_count), STOP_BUDGET

    def note(self, calls: int, reason: str, max_count: int, *, spent_us: float | None = None,
             samples_us: Sequence[float] | None = None, call_us: float | None = None) -> str:
        """The row's record of its repetitions, e.g. `12 timed calls, stopped by the time budget: 10.4 ms of 10 ms
        spent (min 3, max 30)`; `call_us`: the warm-up's time per call a planned count came from."""
        budget = _duration_text(self.time_budget_s * 1e6)
        if call_us is not None:
            spent = f"{budget} at {_duration_text(call_us)} per call in the warm-up"
            verb = "set"
        else:
            spent = f"{_duration_text(spent_us or 0.0)} of {budget} spent"
            verb = "stopped"
        error = relative_standard_error(samples_us) if samples_us is not None else None
        spread = "" if error is None else f"standard error {100 * error:.2g} % of the mean"
        target = f"target {100 * self.target_rel_error:g} %" if self.target_rel_error > 0 else "no target"
        if reason == STOP_SPREAD:
            detail = f"{spread}, {target}"
        elif reason == STOP_BUDGET:
            detail = spent
        else:
            detail = ", ".join(filter(None, (f"time budget {spent}" if call_us is not None else spent, spread)))
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
