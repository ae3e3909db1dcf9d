#!/usr/bin/env python
"""Which state did the dense prefill's MLP run in? Its kernels inside a running MLP against replay's states.

The dense reference decoder's 64 x 1,024-token prefill replays 4-15 % fast on an H200 under every power policy
tried (2026-11-28): its GEMMs at 0.94-0.96 of their profiled time, silu and mul at 0.85-0.91, with heaters before
each call (gemm-history) and with the SM clock held at the profiled one (match-clock) alike. NVML gave
`sw_power_cap` as the reason for every throttled sample of its profile. The workload runs that phase for hundreds
of milliseconds without a pause; replay follows each long call with idle (after-gemm) or rests 100 ms after each
heated call (gemm-history), so the power-cap controller may never reach the state it had in the workload.

This probe times the MLP's four kernels (gate_up GEMM, silu of the gate slice, mul by the up slice, down GEMM, at
the workload's shapes and strides, replay's standard normal draws) with CUDA events, in states:
- `mlp loop`: the MLP itself, run back to back for --loop-s (the workload's own phase; its median after the first
  quarter, and its first iteration);
- `equal idle`: each kernel alone, idle as long as it took after each call (replay's after-gemm for long calls);
- `steady heater H ms`: --preheat-s of bf16 8192^3 GEMMs, then every call right after H ms of them, no idle;
- `steady mixed H ms`: the same with a GEMM/copy heater spending --mixed-fraction of its time in GEMMs;
with NVML's SM clock, power and clock-event reasons over each block, and each median against --profiled (the
profile's own times: `name=us`).

    python benchmarks/power_phase_probe.py --output OUT.json [--profiled silu=5353.2 mul=5077.6 ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opperf.power_samples import reason_shares  # noqa: E402
from opperf.workload.power import NvmlSampler  # noqa: E402

# The H200 profile of 2026-11-28 (benchmarks/results/power_phase/): the rows' in-workload means (µs).
H200_PROFILED = {"mm gate_up": 44737.0, "silu": 5353.2, "mul": 5077.6, "mm down": 23007.6}


def mlp_kernels(tokens: int, hidden: int, intermediate: int) -> dict:
    """The MLP's kernels as the workload launches them (F.linear's mm on the transposed weight; the gate and up
    halves are slices of one fused output)."""
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(tokens, hidden, **bf16)
    w_gate_up = torch.randn(2 * intermediate, hidden, **bf16)
    w_down = torch.randn(hidden, intermediate, **bf16)
    gate_up = torch.mm(x, w_gate_up.t())
    gate, up = gate_up[:, :intermediate], gate_up[:, intermediate:]
    activated = F.silu(gate)
    hidden_act = activated * up
    return {"mm gate_up": lambda: torch.mm(x, w_gate_up.t(), out=gate_up),
            "silu": lambda: F.silu(gate, inplace=False),
            "mul": lambda: torch.mul(activated, up, out=hidden_act),
            "mm down": lambda: torch.mm(hidden_act, w_down.t())}


class Heater:
    """bf16 8192^3 GEMMs, alone or interleaved with 1 GiB copies at a GEMM time fraction."""

    def __init__(self):
        self.a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        self.b, self.c = self.a.clone(), torch.empty_like(self.a)
        self.src = torch.randn(2 ** 29, device="cuda", dtype=torch.bfloat16)
        self.dst = torch.empty_like(self.src)
        self.gemm_us = self._time(self.gemm)
        self.copy_us = self._time(self.copy)

    def gemm(self):
        torch.mm(self.a, self.b, out=self.c)

    def copy(self):
        self.dst.copy_(self.src)

    @staticmethod
    def _time(fn, n=5) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1000.0 / n

    def block(self, ms: float, fraction: float = 1.0) -> None:
        """About `ms` of heater work, `fraction` of it in GEMMs (launched, not waited for)."""
        spent, owed = 0.0, 0.0
        copies_per_gemm = self.gemm_us * (1 - fraction) / (fraction * self.copy_us) if fraction < 1 else 0.0
        while spent < ms * 1000.0:
            self.gemm()
            spent += self.gemm_us
            owed += copies_per_gemm
            while owed >= 1:
                self.copy()
                spent += self.copy_us
                owed -= 1


def block_state(sampler: NvmlSampler | None, start_us: float, end_us: float) -> dict:
    if sampler is None:
        return {}
    state = sampler.state_during(start_us, end_us)
    inside = [s for s in sampler.samples if start_us <= s[0] <= end_us]
    shares = reason_shares(inside, sampler.max_clock)
    return {"sm_mhz": state[0] if state else None, "power_w": state[1] if state else None,
            "reasons": shares["reasons"] if shares else None}


def timed_calls(fn, reps: int, before=None, idle: bool = False) -> list[float]:
    """CUDA-event µs of each call; `before()` is launched ahead of each (untimed); `idle`: after each call, the
    host waits for it and sleeps as long as it took."""
    samples = []
    for _ in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        if idle:
            end.synchronize()
            took = start.elapsed_time(end) * 1000.0
            samples.append(took)
            time.sleep(took / 1e6)
        else:
            samples.append((start, end))
    torch.cuda.synchronize()
    return [s if isinstance(s, float) else s[0].elapsed_time(s[1]) * 1000.0 for s in samples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--hidden", type=int, default=5120)
    parser.add_argument("--intermediate", type=int, default=25600)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--loop-s", type=float, default=1.5)
    parser.add_argument("--preheat-s", type=float, default=0.4)
    parser.add_argument("--rest-s", type=float, default=1.0, help="idle between states")
    parser.add_argument("--heater-ms", type=float, nargs="+", default=[5.0, 20.0, 50.0])
    parser.add_argument("--mixed-fraction", type=float, default=0.7)
    parser.add_argument("--profiled", nargs="*", default=None, metavar="NAME=US",
                        help="the profile's times of the kernels (default: the H200 profile of 2026-11-28)")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    profiled = dict(H200_PROFILED)
    for item in args.profiled or ():
        name, _, value = item.rpartition("=")
        profiled[name] = float(value)

    sampler = NvmlSampler.start_if_available()
    kernels = mlp_kernels(args.tokens, args.hidden, args.intermediate)
    heater = Heater()
    results = []

    def record(state: str, name: str, samples: list[float], start_us: float, extra: dict | None = None):
        median = statistics.median(samples)
        entry = {"state": state, "kernel": name, "median_us": median, "calls": len(samples),
                 "ratio_to_profiled": median / profiled[name] if name in profiled else None,
                 **block_state(sampler, start_us, time.monotonic_ns() / 1000.0), **(extra or {})}
        results.append(entry)
        ratio = f"{entry['ratio_to_profiled']:.3f}" if entry["ratio_to_profiled"] else "-"
        print(f"{state:28s} {name:11s} {median:10.1f} µs  x profiled {ratio}  SM {entry.get('sm_mhz')} MHz "
              f"{entry.get('power_w') or 0:.0f} W  {entry.get('reasons')}", flush=True)

    def rest():
        torch.cuda.synchronize()
        time.sleep(args.rest_s)

    # The MLP itself, back to back: the workload's phase.
    rest()
    start_us = time.monotonic_ns() / 1000.0
    per_kernel: dict[str, list] = {name: [] for name in kernels}
    deadline = time.monotonic() + args.loop_s
    while time.monotonic() < deadline:
        for name, fn in kernels.items():
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            per_kernel[name].append((begin, end))
        torch.cuda.synchronize()        # the host keeps at most one MLP queued: the loop stays back to back
    for name, pairs in per_kernel.items():
        times = [b.elapsed_time(e) * 1000.0 for b, e in pairs]
        record("mlp loop", name, times[len(times) // 4:], start_us, {"first_us": times[0], "iterations": len(times)})

    for name, fn in kernels.items():
        rest()
        start_us = time.monotonic_ns() / 1000.0
        record("equal idle", name, timed_calls(fn, args.reps, idle=True), start_us)
    for fraction, label in ((1.0, "heater"), (args.mixed_fraction, f"mixed {args.mixed_fraction:.0%}")):
        for ms in args.heater_ms:
            for name, fn in kernels.items():
                rest()
                heater.block(args.preheat_s * 1000.0, fraction)
                start_us = time.monotonic_ns() / 1000.0
                record(f"steady {label} {ms:g} ms", name,
                       timed_calls(fn, args.reps, before=lambda ms=ms, f=fraction: heater.block(ms, f)), start_us)
    if sampler is not None:
        sampler.stop()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "shape": {"tokens": args.tokens, "hidden": args.hidden, "intermediate": args.intermediate},
        "heater": {"gemm_us": heater.gemm_us, "copy_us": heater.copy_us, "preheat_s": args.preheat_s},
        "profiled": profiled, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
