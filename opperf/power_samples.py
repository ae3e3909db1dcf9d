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
# `Power(W)` is nvmlDeviceGetPowerUsage: on Hopper (Ampere but GA100, and newer) an average over the last second,
# which hides a GEMM's draw (Mixtral's H200 profile ran its rows throttled at 388-451 W of a 700 W cap, every
# throttled sample for `sw_power_cap`: 2026-11-28, benchmarks/results/power_phase/). `Instant Power(W)` is NVML's
# NVML_FI_DEV_POWER_INSTANT field, sampled since then; older samples files lack it, and their rows get no column.
FIELDS = ("SM Clock(MHz)", "Power(W)", "Temperature(C)", "Instant Power(W)")
# NVML's clock-event reasons (nvmlDeviceGetCurrentClocksEventReasons, a bit mask per sample): why the SM clock was
# under its maximum. The sampler keeps each sample's mask after FIELDS; a row gets none of it (a mask has no mean),
# the profile's summary does (`reason_shares`).
REASONS_FIELD = "clock_event_reasons"
SAMPLE_FIELDS = ("t_us", *FIELDS, REASONS_FIELD)          # a sample as the sampler writes it
# The layout of samples files written before 2026-11-28, which name no fields.
OLD_SAMPLE_FIELDS = ("t_us", "SM Clock(MHz)", "Power(W)", "Temperature(C)")
CLOCK_EVENT_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                       0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
                       0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
THROTTLED_MHZ = 50.0    # a sample or row at least this far under the full SM clock counts as throttled


def reason_names(mask: int) -> list[str]:
    """The names of the reasons set in one clock-event mask (unknown bits as hex)."""
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return names + ([hex(rest)] if rest else [])


def reason_shares(samples: list, max_clock: float | None = None, fields=SAMPLE_FIELDS) -> dict | None:
    """Over the samples (laid out as `fields`: time, SM clock, ..., mask) the clock was throttled in (THROTTLED_MHZ
    or more under `max_clock`, else under the highest sampled clock): how many there were, and per reason the share
    of them it was set in ("none" for a mask of 0). None where no sample has a mask (a sampler before 2026-11-28, or
    a driver that does not report them)."""
    if REASONS_FIELD not in fields:
        return None
    clock, mask = fields.index(FIELDS[0]), fields.index(REASONS_FIELD)
    masked = [s for s in samples if len(s) > mask and s[mask] is not None]
    if not masked:
        return None
    full = max_clock or max(s[clock] for s in masked)
    throttled = [int(s[mask]) for s in masked if s[clock] <= full - THROTTLED_MHZ]
    counts: dict[str, int] = {}
    for bits in throttled:
        for name in reason_names(bits) or ["none"]:
            counts[name] = counts.get(name, 0) + 1
    return {"samples": len(masked), "throttled_samples": len(throttled), "full_clock_mhz": full,
            "reasons": {name: count / len(throttled) for name, count in sorted(counts.items(), key=lambda kv: -kv[1])}}


@dataclass(frozen=True)
class PowerSamples:
    """`power_samples.json` read back, with the offset that maps trace time (µs) onto sample time; `values` are
    the samples' `fields` (those of FIELDS the file has)."""

    times_us: list[float]
    values: list[tuple[float, ...]]
    offset_us: float               # sample time = trace time + offset_us
    fields: tuple[str, ...] = FIELDS[:3]

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
    layout = list(document.get("fields") or OLD_SAMPLE_FIELDS)
    fields = tuple(f for f in FIELDS if f in layout)
    columns = [layout.index(f) for f in fields]
    rows = sorted(document["samples"], key=lambda r: r[0])
    return PowerSamples([r[0] for r in rows], [tuple(r[c] if c < len(r) else None for c in columns) for r in rows],
                        document["sync_us"] - sync_trace_us, fields)


# Ops whose long calls draw the power that sets the GPU's state (GEMMs and attention), by their op name.
POWER_DRAWING_OPS = frozenset({"mm", "bmm", "addmm", "baddbmm", "_grouped_mm", "_scaled_mm", "_scaled_grouped_mm",
                               "convolution", "_convolution", "linear", "matmul"})
# A per-call field of our own: how long one GEMM right before the call would have to run to leave the GPU in the
# state the workload's GEMM/attention history left it in (gemm_time_before).
GEMM_BEFORE = "Equivalent GEMM Before(us)"
# A per-call field of our own: how long the device had been idle when the call's first kernel started (no kernel,
# memcpy or memset of any stream running): a call the host was late to launch (the rotary embedding at a forward's
# start, a decode step's first kernels) runs on a GPU that idled; replay times its calls back to back.
IDLE_BEFORE = "Idle Before(us)"
# The time constant of the exponential history: a first-order fit. Measured with idle before each history
# (benchmarks/results/memory_state/, history), the state is a step: nothing after up to ~30 ms of compute-bound
# GEMMs, +13-16 % on the prefill's strided silu and broadcast mul from 35-70 ms on. Replay's heater of the
# equivalent length crosses that step where the workload's history did.
GEMM_STATE_TAU_US = 25_000.0
GEMM_WINDOW_US = 6 * GEMM_STATE_TAU_US


def op_base_name(op_name: str) -> str:
    """`mm` of `aten::mm`, `aten::mm.out` or `mm`."""
    return op_name.split("::")[-1].split(".")[0]


def draws_power(op_name: str) -> bool:
    """Whether an op (trace name, `aten::mm`) is a GEMM or attention call: one that sets the GPU's power state."""
    short = op_base_name(op_name)
    return short in POWER_DRAWING_OPS or "attention" in short


def call_flops(op_name: str, input_dims: list | None) -> float | None:
    """Floating-point operations of one GEMM or attention call from its input shapes (the trace's `Input Dims`);
    None for an op or a shape this does not know. Attention counts the full Sq x Sk score matrix (q and k in
    (batch, heads, seq, dim), or (batch, seq, heads, dim) for the flash and memory-efficient kernels)."""
    short = op_base_name(op_name)
    dims = [tuple(d) for d in (input_dims or []) if isinstance(d, list | tuple) and d]
    try:
        if short in {"mm", "_scaled_mm"}:
            (m, k), (_, n) = dims[0], dims[1]
            return 2.0 * m * k * n
        if short == "addmm":
            (m, k), (_, n) = dims[-2], dims[-1]
            return 2.0 * m * k * n
        if short == "bmm":
            (b, m, k), (_, _, n) = dims[0], dims[1]
            return 2.0 * b * m * k * n
        if short == "baddbmm":
            (b, m, k), (_, _, n) = dims[-2], dims[-1]
            return 2.0 * b * m * k * n
        if short in {"_grouped_mm", "_scaled_grouped_mm"}:
            (tokens, k), n = dims[0], dims[1][-1]
            return 2.0 * tokens * k * n
        if short == "linear":
            return 2.0 * math.prod(dims[0]) * dims[1][0]
        if "attention" in short:
            q, key = dims[0], dims[1]
            seq = 1 if ("flash" in short or "efficient" in short) else 2
            return 4.0 * math.prod(q) * key[seq]
    except (IndexError, ValueError, TypeError):
        return None
    return None


# A call counts whole in the GEMM history when it runs at the rate of the trace's long compute-bound calls: a
# 64-row decode GEMM streaming its weight, or a 34 ms memory-bound bmm, left an H100 as it found it, 50 ms of
# 8192^3 GEMMs did not (benchmarks/results/memory_state/, history).
LONG_CALL_US = 1000.0


def power_weights(calls: list[tuple[str, list | None, float]]) -> list[float]:
    """Per call (op name, input dims, device µs), how much of its time counts in the GEMM history: 0 for an op
    that does not draw the power (not a GEMM or attention call), else its FLOP rate over the reference rate, at
    most 1. The reference is the 90th percentile of the rates of the trace's calls of 1 ms or more (its
    compute-bound GEMMs), or the fastest call when none is that long. A GEMM whose FLOPs are not known counts
    whole, as every GEMM did before the weighting."""
    drawing = [draws_power(name) for name, _, _ in calls]
    rates = [None if not draws or duration <= 0 or (flops := call_flops(name, dims)) is None else flops / duration
             for draws, (name, dims, duration) in zip(drawing, calls)]
    long_rates = sorted(r for r, (_, _, d) in zip(rates, calls) if r is not None and d >= LONG_CALL_US)
    if long_rates:
        reference = long_rates[min(len(long_rates) - 1, int(0.9 * len(long_rates)))]
    else:
        reference = max((r for r in rates if r is not None), default=None)
    weights = []
    for draws, rate in zip(drawing, rates):
        if not draws:
            weights.append(0.0)
        elif rate is None or not reference:
            weights.append(1.0)
        else:
            weights.append(min(1.0, rate / reference))
    return weights


def gemm_time_before(spans: list[tuple[float, float, float]], tau_us: float = GEMM_STATE_TAU_US) -> list[float]:
    """For each device span (start, end, weight: how much of it counts, power_weights), the length of one GEMM
    ending at its start that leaves the same state as the weighted GEMM/attention time before it: the history
    weighted by exp(-age / tau) (the state a long prefill GEMM leaves a following elementwise call in builds up
    and fades over tens of ms), W = sum of w_i * tau * (exp(-(start - end_i) / tau) - exp(-(start - start_i) /
    tau)), and the equivalent length -tau * ln(1 - W / tau). A 46 ms GEMM right before gives 46 ms; the same GEMM
    ended 20 ms earlier, 11.9 ms. Capped at the window (6 tau), which a GEMM running throughout reaches."""
    gemms = sorted((s, e, float(w)) for s, e, w in spans if w)
    starts = [s for s, _, _ in gemms]
    result = []
    for start, _end, _ in spans:
        weight = 0.0
        first = max(bisect.bisect_left(starts, start - 6 * tau_us) - 1, 0)
        for s, e, w in gemms[first:bisect.bisect_left(starts, start)]:
            s, e = max(s, start - 6 * tau_us), min(e, start)
            if e > s:
                weight += w * tau_us * (math.exp(-(start - e) / tau_us) - math.exp(-(start - s) / tau_us))
        equivalent = -tau_us * math.log(max(1.0 - weight / tau_us, 1e-12)) if weight > 0 else 0.0
        result.append(min(equivalent, 6 * tau_us))
    return result
