"""Duration statistics and number formatting shared by every stage that writes measured values.

One place decides how a measured value reads in a database CSV and what p10/p90/CV mean, so the
parse, replay (cpu/cuda/npu) and report stages cannot drift apart.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def number_or_none(value: object) -> float | None:
    """A cell or field as a float, None where it is empty or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def format_number(value: float | None) -> str:
    """A value as written into a database CSV: rounded to 6 decimals, trailing zeros dropped; None/NaN → ''."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


@dataclass(frozen=True)
class DurationStats:
    """The statistics of one row's measured calls, named for what they are (microseconds)."""

    mean_us: float
    median_us: float
    p10_us: float
    p90_us: float
    cv: float                              # population standard deviation / mean (0 for one sample)
    sample_count: int


def _percentile(ordered: Sequence[float], fraction: float) -> float:
    """Linear-interpolation percentile of sorted values (numpy's default method)."""
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def duration_stats(durations_us: Sequence[float]) -> DurationStats:
    if not durations_us:
        raise ValueError("no samples to summarise")
    ordered = sorted(durations_us)
    mean = statistics.fmean(ordered)
    cv = statistics.pstdev(ordered) / mean if len(ordered) > 1 and mean > 0 else 0.0
    return DurationStats(mean_us=mean, median_us=statistics.median(ordered), p10_us=_percentile(ordered, 0.10),
                         p90_us=_percentile(ordered, 0.90), cv=cv, sample_count=len(ordered))


# A call that took this many times the row's median was interrupted, not slow: another context's time slice or a
# host stall inside the timed range. Legitimate spreads stay far below it (a memcpy's remainder path 2x, the first
# kernel after an idle GPU 2.9x: benchmarks/results/memcpy_tail/, memory_state/). One 58 ms sample among 30 calls
# of 11 µs once made a GEMM row's Average Duration 1,959 µs.
INTERRUPTED_FACTOR = 20.0


def split_interrupted(durations_us: Sequence[float], factor: float = INTERRUPTED_FACTOR,
                      floor_us: float = 0.0) -> tuple[list[float], list[float], float]:
    """(kept, interrupted, median of all): the calls over `factor` times the larger of the median and `floor_us` are
    set apart (none when both are 0). Stage 4b passes the row's longest profiled call as the floor: a row whose calls
    cycle recorded values may legitimately vary as much as the workload's did."""
    median = statistics.median(durations_us) if durations_us else 0.0
    limit = factor * max(median, floor_us)
    if limit <= 0:
        return list(durations_us), [], median
    return [d for d in durations_us if d <= limit], [d for d in durations_us if d > limit], median

