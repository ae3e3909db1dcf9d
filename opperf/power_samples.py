"""NVML samples beside a profile, read back and aligned to the trace (`power_samples.json`, written by
opperf.workload.power): the parse stage joins each kernel to the sample nearest its midpoint.

Here, not beside the sampler: the parse stage runs on hosts without NVML, and imports nothing of it.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass
from pathlib import Path

POWER_SAMPLES = "power_samples.json"
SYNC_RANGE = "opperf::power_sync"
# A kernel further than this from every sample gets no value (the sampler stalled or had not started).
MAX_GAP_US = 50_000.0
# Per-call fields a row gets, and the column names the parse stage gives their means.
FIELDS = ("SM Clock(MHz)", "Power(W)", "Temperature(C)")


@dataclass(frozen=True)
class PowerSamples:
    """`power_samples.json` read back, with the offset that maps trace time (µs) onto sample time."""

    times_us: list[float]
    values: list[tuple[float, ...]]
    offset_us: float               # sample time = trace time + offset_us

    def at(self, trace_start_us: float, trace_end_us: float) -> tuple[float, ...] | None:
        """The sample nearest the midpoint of a trace interval, or None when none lies within MAX_GAP_US."""
        if not self.times_us:
            return None
        t = (trace_start_us + trace_end_us) / 2.0 + self.offset_us
        position = bisect.bisect_left(self.times_us, t)
        nearest = min((i for i in (position - 1, position) if 0 <= i < len(self.times_us)),
                      key=lambda i: abs(self.times_us[i] - t))
        return self.values[nearest] if abs(self.times_us[nearest] - t) <= MAX_GAP_US else None


def samples_at(trace_path: Path, sync_trace_us: float | None) -> PowerSamples | None:
    """The samples beside a trace, aligned to it by the sync range's start in the trace; None without them."""
    path = Path(trace_path).parent / POWER_SAMPLES
    if not path.is_file() or sync_trace_us is None:
        return None
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("sync_us") is None or not document.get("samples"):
        return None
    rows = sorted(document["samples"])
    return PowerSamples([r[0] for r in rows], [tuple(r[1:]) for r in rows], document["sync_us"] - sync_trace_us)


# Ops whose long calls draw the power that sets the GPU's state (GEMMs and attention), by their op name.
POWER_DRAWING_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "_grouped_mm", "_scaled_mm", "_scaled_grouped_mm",
                               "convolution", "_convolution", "linear", "matmul"})
# A per-call field of our own: how long one GEMM right before the call would have to run to leave the GPU in the
# state the workload's GEMM/attention history left it in (gemm_time_before).
GEMM_BEFORE = "Equivalent GEMM Before(us)"
# The state builds up (and fades) with this time constant: an elementwise call ran 6 % slower after 13 ms of GEMMs
# and 11.5 % after 50 ms (H100, benchmarks/results/memory_state/, sequence): 1 - exp(-t / 25 ms) in that ratio.
GEMM_STATE_TAU_US = 25_000.0
GEMM_WINDOW_US = 6 * GEMM_STATE_TAU_US


def op_base_name(op_name: str) -> str:
    """`mm` of `aten::mm`, `aten::mm.out` or `mm`."""
    return op_name.split("::")[-1].split(".")[0]


def draws_power(op_name: str) -> bool:
    """Whether an op (trace name, `aten::mm`) is a GEMM or attention call: one that sets the GPU's power state."""
    short = op_base_name(op_name)
    return short in POWER_DRAWING_OPS or "attention" in short


def gemm_time_before(spans: list[tuple[float, float, bool]], tau_us: float = GEMM_STATE_TAU_US) -> list[float]:
    """For each device span (start, end, is a GEMM/attention call), the length of one GEMM ending at its start
    that leaves the same state as the GEMM/attention time before it: the history weighted by exp(-age / tau)
    (the state a long prefill GEMM leaves a following elementwise call in builds up and fades over tens of ms),
    W = sum of tau * (exp(-(start - end_i) / tau) - exp(-(start - start_i) / tau)), and the equivalent length
    -tau * ln(1 - W / tau). A 46 ms GEMM right before gives 46 ms; the same GEMM ended 20 ms earlier, 11.9 ms.
    Capped at the window (6 tau), which a GEMM running throughout reaches."""
    gemms = sorted((s, e) for s, e, is_gemm in spans if is_gemm)
    starts = [s for s, _ in gemms]
    result = []
    for start, _end, _ in spans:
        weight = 0.0
        first = max(bisect.bisect_left(starts, start - 6 * tau_us) - 1, 0)
        for s, e in gemms[first:bisect.bisect_left(starts, start)]:
            s, e = max(s, start - 6 * tau_us), min(e, start)
            if e > s:
                weight += tau_us * (math.exp(-(start - e) / tau_us) - math.exp(-(start - s) / tau_us))
        equivalent = -tau_us * math.log(max(1.0 - weight / tau_us, 1e-12)) if weight > 0 else 0.0
        result.append(min(equivalent, 6 * tau_us))
    return result
