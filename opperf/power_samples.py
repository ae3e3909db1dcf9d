"""NVML samples beside a profile, read back and aligned to the trace (`power_samples.json`, written by
opperf.workload.power): the parse stage joins each kernel to the sample nearest its midpoint.

Here, not beside the sampler: the parse stage runs on hosts without NVML, and imports nothing of it.
"""

from __future__ import annotations

import bisect
import json
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
