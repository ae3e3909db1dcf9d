"""The GPU's power state while a workload runs: SM clock, power and temperature sampled through NVML.

A kernel's time depends on the clock it ran at, and the clock on what ran before it: a long GEMM holds an H100
at its power limit and the clock drops (docs/replay.md, "Power state"). To compare a replayed row with the
call it re-measures, the clock that call saw has to be known. `NvmlSampler` polls NVML (nvidia-ml-py's
`pynvml`) from a thread while the profiler runs and writes `power_samples.json` beside the trace; the parse
stage joins each kernel to the sample nearest its midpoint (`samples_at`) and keeps the per-call values as
columns of the row (`Profiling Average SM Clock(MHz)`, `… Power(W)`, `… Temperature(C)`: means over
the row's calls).

The trace's clock is not NVML's: a `record_function` range named `opperf::power_sync` is entered at a time
the sampler notes (`time.monotonic_ns`), so the parse stage can map trace time onto sample time whatever
clock the profiler used.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from opperf.io import write_text_atomic
from opperf.log import get_logger
from opperf.power_samples import (FIELDS, MAX_GAP_US, POWER_SAMPLES, SAMPLE_FIELDS, SYNC_RANGE, THROTTLED_MHZ,
                                  reason_shares)

__all__ = ["FIELDS", "POWER_SAMPLES", "SYNC_RANGE", "NvmlSampler"]

log = get_logger("workload")

DEFAULT_INTERVAL_S = 0.002


def nvml_index(torch_index: int) -> int:
    """NVML's index of torch's cuda device `torch_index`. They differ under CUDA_VISIBLE_DEVICES (`2,3`: torch's
    0 is NVML's 2; UUIDs too), which every job confined to its device slot runs with; torch maps it itself."""
    import torch

    try:
        return int(torch.cuda._get_nvml_device_index(torch_index))
    except (AttributeError, RuntimeError, ValueError) as exc:
        import os

        if os.environ.get("CUDA_VISIBLE_DEVICES"):
            log.warning("cannot map cuda device %d to its NVML index under CUDA_VISIBLE_DEVICES=%s (%s); sampling "
                        "NVML device %d", torch_index, os.environ["CUDA_VISIBLE_DEVICES"], exc, torch_index)
        return torch_index


def clock_event_reader(handle):
    """A callable that reads the device's clock-event reasons mask (None once NVML says it cannot): the newer
    name of the call where the installed nvidia-ml-py has it, the older `...ThrottleReasons` otherwise."""
    import pynvml

    read = (getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            or getattr(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    try:
        read(handle)
    except (TypeError, pynvml.NVMLError) as exc:
        log.info("no clock-event reasons in the power samples: %s", exc)
        return lambda: None
    return lambda: int(read(handle))


# nvmlValueType_t: which member of the field value's union holds it.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def instant_power_reader(handle):
    """A callable that reads the instantaneous board power (W; NVML_FI_DEV_POWER_INSTANT), or gives None where
    the driver or nvidia-ml-py does not have the field (nvmlDeviceGetPowerUsage averages over a second on Hopper)."""
    import pynvml

    field_id = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)

    def read():
        value = pynvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
        if value.nvmlReturn != pynvml.NVML_SUCCESS:
            raise pynvml.NVMLError(value.nvmlReturn)
        return getattr(value.value, _VALUE_MEMBERS[value.valueType]) / 1000.0

    try:
        if field_id is None:
            raise TypeError("this nvidia-ml-py has no NVML_FI_DEV_POWER_INSTANT")
        read()
    except (TypeError, KeyError, AttributeError, pynvml.NVMLError) as exc:
        log.info("no instantaneous power in the power samples: %s", exc)
        return lambda: None
    return read


@dataclass
class NvmlSampler:
    """Polls one GPU's SM clock (MHz), power draw (W, NVML's average), temperature (C), instantaneous power (W) and
    clock-event reasons (NVML's mask; None where the driver does not report them) every `interval_s` on a thread."""

    device_index: int = 0
    interval_s: float = DEFAULT_INTERVAL_S
    samples: list[tuple] = field(default_factory=list)   # SAMPLE_FIELDS: (monotonic µs, MHz, W, C, W, mask)
    sync_us: float | None = None
    device_name: str = ""
    max_clock: float = 0.0
    _handle: object = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @classmethod
    def start_if_available(cls, device_index: int = 0, interval_s: float = DEFAULT_INTERVAL_S) -> NvmlSampler | None:
        """A running sampler of torch's cuda device `device_index`, or None (logged) where NVML cannot be read: no
        nvidia-ml-py, no driver."""
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(nvml_index(device_index))
            name = pynvml.nvmlDeviceGetName(handle)
        except Exception as exc:  # noqa: BLE001 — ImportError, NVMLError_*: the profile is still useful
            log.warning("no power-state samples: NVML is not readable (%s: %s); install nvidia-ml-py to record the "
                        "SM clock, power and temperature of the profiled kernels", type(exc).__name__, exc)
            return None
        sampler = cls(device_index, interval_s, device_name=name if isinstance(name, str) else name.decode())
        sampler._handle = handle
        sampler.max_clock = float(pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM))
        sampler._thread = threading.Thread(target=sampler._run, args=(handle,), name="opperf-nvml", daemon=True)
        sampler._thread.start()
        return sampler

    def _run(self, handle) -> None:
        import pynvml

        reasons, instant_power = clock_event_reader(handle), instant_power_reader(handle)
        while not self._stop.is_set():
            now = time.monotonic_ns() / 1000.0
            try:
                clock = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
                power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
                temperature = float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
            except pynvml.NVMLError as exc:
                log.warning("NVML sampling stopped: %s", exc)
                return
            self.samples.append((now, clock, power, temperature, instant_power(), reasons()))
            self._stop.wait(self.interval_s)

    def state_during(self, start_us: float, end_us: float) -> tuple[float, float] | None:
        """(median SM clock, median power) of the samples taken in [start_us, end_us] (monotonic µs), else of
        the one nearest the window's middle, if it lies within MAX_GAP_US. The samples are in time order (one
        thread appends them): bisected, not scanned, since a replay asks once per row."""
        samples, count = self.samples, len(self.samples)
        inside = samples[bisect.bisect_left(samples, (start_us,), 0, count):
                         bisect.bisect_right(samples, (end_us, math.inf), 0, count)]
        if not inside:
            middle = (start_us + end_us) / 2
            after = bisect.bisect_left(samples, (middle,), 0, count)
            nearest = min(samples[max(after - 1, 0):min(after + 1, count)], key=lambda s: abs(s[0] - middle),
                          default=None)
            if nearest is None or abs(nearest[0] - middle) > MAX_GAP_US:
                return None
            inside = [nearest]
        clocks, powers = sorted(s[1] for s in inside), sorted(s[2] for s in inside)
        return clocks[len(clocks) // 2], powers[len(powers) // 2]

    def current_clock(self) -> float:
        """The SM clock now (MHz), read directly (not the sampler's last sample)."""
        import pynvml

        return float(pynvml.nvmlDeviceGetClockInfo(self._handle, pynvml.NVML_CLOCK_SM))

    def mark_sync(self) -> None:
        """Note the monotonic time at which the caller entered the `SYNC_RANGE` profiler range."""
        self.sync_us = time.monotonic_ns() / 1000.0

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def write(self, path: str | Path) -> None:
        document = {"device_index": self.device_index, "device_name": self.device_name,
                    "interval_s": self.interval_s, "clock": "time.monotonic_ns / 1000 (µs)",
                    "sync_range": SYNC_RANGE, "sync_us": self.sync_us,
                    "max_clock_mhz": self.max_clock, "fields": list(SAMPLE_FIELDS),
                    "samples": [list(s) for s in self.samples]}
        write_text_atomic(path, json.dumps(document) + "\n")
        if self.samples:
            clocks = sorted(s[1] for s in self.samples)
            log.info("power state: %d NVML samples over %.1f s; SM clock %.0f..%.0f MHz (median %.0f), power up to "
                     "%.0f W", len(self.samples), (self.samples[-1][0] - self.samples[0][0]) / 1e6, clocks[0],
                     clocks[-1], clocks[len(clocks) // 2], max(s[2] for s in self.samples))
            shares = reason_shares(self.samples, self.max_clock)
            if shares and shares["throttled_samples"]:
                log.info("power state: %d samples %.0f MHz or more under the full %.0f MHz; NVML's reasons: %s",
                         shares["throttled_samples"], THROTTLED_MHZ, shares["full_clock_mhz"],
                         ", ".join(f"{name} {share:.0%}" for name, share in shares["reasons"].items()))
