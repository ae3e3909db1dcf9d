#!/usr/bin/env python
"""Does a long kernel replayed back to back run slower than inside the workload, and why?

Replay times each call right after the previous one (with only the cache preparation between), so a
multi-millisecond GEMM keeps the GPU at its power limit for the whole measurement; inside a model it
alternates with lighter kernels. This probe times the same calls back to back and with idle gaps of
1x and 3x the call's length between them, reads the SM clock and power (NVML) as it goes, and times
the GEMM on workload-like values (weights scaled by K**-0.5) as well as on unit normals.
Prints a table and writes JSON (--json).
"""

import argparse
import json
import statistics
import time

import torch


def nvml_reader():
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return lambda: (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
    except Exception:  # noqa: BLE001 — NVML is optional
        return lambda: (None, None)


def time_calls(fn, count, gap_factor, read):
    times, clocks, powers = [], [], []
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    for _ in range(count):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end) * 1000.0
        clock, power = read()
        times.append(elapsed)
        clocks.append(clock)
        powers.append(power)
        if gap_factor:
            time.sleep(elapsed * gap_factor / 1e6)
    return times, clocks, powers


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default="cuda_power_probe.json")
    parser.add_argument("--count", type=int, default=30)
    args = parser.parse_args()
    read = nvml_reader()
    torch.manual_seed(0)
    m, k, n = 8192, 5120, 51200
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w_unit = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    w_scaled = (torch.randn(n, k, device="cuda") * k ** -0.5).to(torch.bfloat16)
    gate_up = torch.randn(64, 1024, 2 * 25600, device="cuda", dtype=torch.bfloat16)
    gate = gate_up[..., :25600]                       # the workload's chunk view (row stride 51200)
    cases = {
        "mm 8192x5120x51200 unit-normal weights": lambda: torch.mm(x, w_unit.t()),
        "mm 8192x5120x51200 K^-0.5 weights": lambda: torch.mm(x, w_scaled.t()),
        "silu 64x1024x25600 strided": lambda: torch.nn.functional.silu(gate),
    }
    results = []
    for name, fn in cases.items():
        for gap in (0, 1, 3):
            times, clocks, powers = time_calls(fn, args.count, gap, read)
            results.append({"case": name, "gap_factor": gap, "mean_us": statistics.mean(times),
                             "first5_us": statistics.mean(times[:5]), "last5_us": statistics.mean(times[-5:]),
                             "sm_clock_mhz_first": clocks[0], "sm_clock_mhz_last": clocks[-1],
                             "power_w_max": max(p for p in powers if p is not None) if powers[0] is not None else None})
            time.sleep(2)
    print(f"{'case':42s} gap  mean_us  first5  last5  clk0  clkN  Pmax")
    for r in results:
        print(f"{r['case']:42s} {r['gap_factor']:3d} {r['mean_us']:8.1f} {r['first5_us']:7.1f} {r['last5_us']:6.1f} "
              f"{r['sm_clock_mhz_first']} {r['sm_clock_mhz_last']} {r['power_w_max']}")
    with open(args.json, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "results": results}, handle,
                  indent=1)


if __name__ == "__main__":
    main()
