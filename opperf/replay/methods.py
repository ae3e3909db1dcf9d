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

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opperf.power_samples import POWER_DRAWING_OPS, op_base_name

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


@dataclass
class TimingResult:
    """The per-call samples of one case (microseconds) and how they were taken."""

    samples_us: list[float]
    method: str
    l2_policy: str
    other_samples_us: dict[str, list[float]] = field(default_factory=dict)   # e.g. CUDA-event samples
    power_state: tuple[float, float] | None = None     # (SM clock MHz, power W) while the calls ran (cuda, NVML)


class Timer(Protocol):
    """Times cases; a batching timer may return the samples only at `collect()`.

    `measure(case, warmup_count, repeat_count, key)` runs the warm-up and timed calls of one case
    (a `opperf.replay.inputs.ReplayCase`) and keeps what it needs to attribute samples to `key`;
    `collect()` returns every key measured since the last collect with its TimingResult (an empty
    sample list means an outer session times the calls: npu). `close()` ends what the timer keeps running (the
    cuda timer's NVML sampler thread): a persistent replay server makes one timer per job, and each one left
    polling burdens every later job.
    """

    backend: str

    def measure(self, case: Any, warmup_count: int, repeat_count: int, key: Hashable) -> None: ...

    def collect(self) -> dict[Hashable, TimingResult]: ...

    def synchronize(self) -> None: ...

    def close(self) -> None: ...
