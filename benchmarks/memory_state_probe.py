"""Do the large rows of a long prefill slow down in the state its GEMMs leave the GPU in, and which ones?

The dense decoder's large elementwise rows of the 65,536-token prefill replay 9-15 % faster than in the workload,
which ran them at 1,650-1,810 MHz after its long GEMMs (benchmarks/results/cuda_replay_reuse/). This probe times
kernels of that size (CUDA events, median of --reps) on a rested GPU and right after seconds of back-to-back
8192^3 GEMMs (the power-limited state: SM clock down, silicon and memory hot), with NVML's SM and memory clocks,
power and temperature read before and after, in two layouts: contiguous same-shape operands (the vectorised
streaming kernel) and the workload's own (strided slices of fused projections, broadcast operands, an expanded KV
source: TensorIterator's non-vectorised kernels). The ratio of the two states, against the ratio of their clocks,
says how much of a row's time follows the SM clock.

    python benchmarks/memory_state_probe.py [--output benchmarks/results/memory_state/DEVICE.json]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import statistics
import time
from pathlib import Path

import torch


def nvml_state(handle) -> dict:
    import pynvml

    return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            "temp_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)}


def timed(fn, reps: int, before=None) -> list[float]:
    """CUDA-event time (µs) of each of `reps` calls of fn; `before()`, if given, runs ahead of each, untimed."""
    samples = []
    for _ in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return samples


def sequence_probe(reps: int) -> list[dict]:
    """silu and mul of the dense prefill's MLP timed alone (rested) and inside the MLP as the workload runs it
    (gate_up GEMM, silu of its gate slice, mul by its up slice, down GEMM; no synchronisation in between)."""
    dev = torch.device("cuda")
    bf16 = {"device": dev, "dtype": torch.bfloat16}
    x = torch.randn(65536, 5120, **bf16)
    w_gate_up = torch.randn(5120, 51200, **bf16) / 100
    w_down = torch.randn(25600, 5120, **bf16) / 100
    events = {name: [] for name in ("gate_up mm", "silu", "mul", "down mm")}

    def mlp(record: bool):
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(5)]
        marks[0].record()
        gate_up = torch.mm(x, w_gate_up)
        marks[1].record()
        act = torch.nn.functional.silu(gate_up[:, :25600])
        marks[2].record()
        hidden = act * gate_up[:, 25600:]
        marks[3].record()
        torch.mm(hidden, w_down)
        marks[4].record()
        marks[4].synchronize()
        if record:
            for (name, samples), start, end in zip(events.items(), marks, marks[1:]):
                samples.append(start.elapsed_time(end) * 1000.0)

    mlp(False)
    for _ in range(reps):
        mlp(True)
    # silu right after GEMMs of other data and of growing length: is it the producer or a long GEMM before it?
    gate_up = torch.mm(x, w_gate_up)
    heaters = {f"{n}^3 x{k}": (torch.randn(n, n, **bf16), torch.randn(n, n, **bf16), k)
               for n, k in ((4096, 1), (8192, 1), (8192, 8), (8192, 32))}
    after = {}
    def gemms(a, b, count):
        for _ in range(count):
            torch.mm(a, b)

    for name, (a, b, count) in heaters.items():
        samples = timed(lambda: torch.nn.functional.silu(gate_up[:, :25600]), reps,
                        before=functools.partial(gemms, a, b, count))
        after[name] = statistics.median(samples)
        print(f"silu after a {name} GEMM (other data): {after[name]:9.1f} µs", flush=True)
    del heaters
    gate_up = torch.mm(x, w_gate_up)
    act = torch.nn.functional.silu(gate_up[:, :25600])
    torch.cuda.synchronize()
    time.sleep(3.0)
    alone = {"silu": timed(lambda: torch.nn.functional.silu(gate_up[:, :25600]), reps),
             "mul": timed(lambda: act * gate_up[:, 25600:], reps)}
    results = []
    for name, samples in events.items():
        entry = {"kernel": name, "in_mlp_us": statistics.median(samples),
                 "alone_us": statistics.median(alone[name]) if name in alone else None}
        if name == "silu":
            entry["after_other_gemms_us"] = after
        results.append(entry)
        print(f"{name:12s} in the MLP {entry['in_mlp_us']:9.1f} µs"
              + (f"   alone {entry['alone_us']:9.1f} µs" if entry["alone_us"] else ""), flush=True)
    return results


def mixed_history(gemm, copy, gemm_ms: float, copy_ms: float, fraction: float, length_ms: float):
    """A history of `length_ms` that spends `fraction` of its time in compute-bound GEMMs and the rest in 1 GiB
    copies, interleaved as evenly as whole calls allow (a prefill alternates its GEMMs with memory-bound kernels, at
    560-620 W where GEMMs alone draw 700 W): the callable, and its length as planned (ms). Written 2026-11-28 for
    the dense prefill's state (benchmarks/results/value_power/), not yet run on a GPU."""
    copies_per_gemm = gemm_ms * (1 - fraction) / (fraction * copy_ms)
    calls, owed, spent = [], 0.0, 0.0
    while spent < length_ms:
        calls.append(gemm)
        spent += gemm_ms
        owed += copies_per_gemm
        while owed >= 1 and spent < length_ms:
            calls.append(copy)
            spent += copy_ms
            owed -= 1

    def run():
        for call in calls:
            call()

    return run, spent


def history_probe(reps: int, rest_s: float, compute_ms: list[float] | None = None,
                  mixed: list[float] | None = None, mixed_ms: list[float] | None = None) -> list[dict]:
    """The state a long prefill leaves, by what ran before: each target kernel timed rested and right after a
    history of one kind and length (no synchronisation in between; `rest_s` of idle before each history):
    compute-bound GEMMs (bf16 8192^3), memory-bound GEMMs (64 rows against a 512 MiB weight, as a decode step
    streams its weights), the reference decoder's lm_head bmm over an expanded weight (34 ms, memory-bound), and
    an elementwise stream (1 GiB copies). Which history the slowdown follows decides how replay's GEMM history
    (opperf.power_samples.gemm_time_before) must weigh each call. `compute_ms`: only compute-bound GEMM histories,
    of these lengths (where between 25 and 50 ms the slowdown sets in). `mixed`: GEMM time fractions of mixed
    histories (`mixed_history`) of each of `mixed_ms`, beside a compute-bound history of each of those lengths."""
    dev = torch.device("cuda")
    bf16 = {"device": dev, "dtype": torch.bfloat16}
    gate_up = torch.randn(64, 1024, 51200, **bf16)
    x = torch.randn(64, 1024, 5120, **bf16)
    weight = torch.randn(5120, **bf16)
    cache, token = torch.randn(64, 8, 1024, 128, **bf16), torch.randn(64, 8, 1, 128, **bf16)
    key = torch.randn(64, 8, 1025, 128, **bf16)
    kv_source, kv_dest = key.unsqueeze(2).expand(64, 8, 8, 1025, 128), torch.empty(64, 8, 8, 1025, 128, **bf16)
    targets = {"silu strided gate slice 64x1024x25600": lambda: torch.nn.functional.silu(gate_up[..., :25600]),
               "mul 64x1024x5120 x weight(5120)": lambda: torch.mul(x, weight),
               "cat KV append 64x8x1024x128 + 1": lambda: torch.cat((cache, token), dim=2),
               "copy_ KV repeat 64x8x8x1025x128 (expanded)": lambda: kv_dest.copy_(kv_source)}
    a, b = torch.randn(8192, 8192, **bf16), torch.randn(8192, 8192, **bf16)
    rows, w_stream = torch.randn(64, 8192, **bf16), torch.randn(8192, 32768, **bf16)
    hidden, lm_head = torch.randn(64, 1, 5120, **bf16), torch.randn(5120, 151936, **bf16)
    src, dst = torch.randn(2**29, **bf16), torch.empty(2**29, **bf16)

    def per_call_ms(fn, n=5):
        fn()
        torch.cuda.synchronize()
        return statistics.median(timed(fn, n)) / 1000.0

    kinds = {"compute GEMM 8192^3": lambda: torch.mm(a, b),
             "memory-bound GEMM 64x8192x32768": lambda: torch.mm(rows, w_stream),
             "lm_head bmm, expanded weight": lambda: torch.bmm(hidden, lm_head.expand(64, -1, -1)),
             "elementwise stream (1 GiB copy)": lambda: dst.copy_(src)}
    lengths_ms = {"compute GEMM 8192^3": (6, 13, 25, 50), "memory-bound GEMM 64x8192x32768": (6, 13, 25, 50),
                  "lm_head bmm, expanded weight": (34,), "elementwise stream (1 GiB copy)": (13, 50)}
    if compute_ms:
        lengths_ms = {"compute GEMM 8192^3": tuple(compute_ms)}
    if mixed:
        lengths_ms = {"compute GEMM 8192^3": tuple(mixed_ms or (70.0,)),
                      "elementwise stream (1 GiB copy)": ()}     # no history of its own: timed for the mixed ones
    call_ms = {kind: per_call_ms(kinds[kind]) for kind in lengths_ms}
    for fraction in mixed or ():
        for ms in mixed_ms or (70.0,):
            kind = f"mixed, {fraction:.0%} GEMM time, {ms:g} ms"
            kinds[kind], planned = mixed_history(kinds["compute GEMM 8192^3"], kinds["elementwise stream (1 GiB copy)"],
                                                 call_ms["compute GEMM 8192^3"],
                                                 call_ms["elementwise stream (1 GiB copy)"], fraction, ms)
            lengths_ms[kind], call_ms[kind] = (planned,), planned     # one call of the whole planned history
    print("per call: " + ", ".join(f"{k} {v:.3f} ms" for k, v in call_ms.items()), flush=True)
    results = []
    for target, fn in targets.items():
        timed(fn, 2)
        histories = [("none", 0, None)] + [(kind, ms, kinds[kind]) for kind, lengths in lengths_ms.items()
                                           for ms in lengths]
        rested = None
        for kind, ms, history in histories:
            count = max(1, round(ms / call_ms[kind])) if history else 0

            def before(history=history, count=count):
                torch.cuda.synchronize()
                time.sleep(rest_s)
                for _ in range(count):
                    history()

            median = statistics.median(timed(fn, reps, before=before))
            rested = rested or median
            results.append({"target": target, "history": kind, "history_ms": round(count * call_ms.get(kind, 0), 2),
                            "calls": count, "median_us": median, "ratio_to_rested": median / rested})
            print(f"{target:44s} after {kind:34s} {count * call_ms.get(kind, 0):6.1f} ms: {median:9.1f} µs "
                  f"({median / rested:.3f})", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None)
    parser.add_argument("--load-s", type=float, default=4.0, help="seconds of back-to-back GEMMs before (default 4)")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--sequence", action="store_true",
                        help="time silu and mul inside the prefill's MLP against alone, instead of the load states")
    parser.add_argument("--history", action="store_true",
                        help="time the large rows after histories of each kind and length (history_probe)")
    parser.add_argument("--rest-s", type=float, default=0.3, help="idle before each history (--history)")
    parser.add_argument("--compute-ms", type=float, nargs="+", default=None,
                        help="--history with compute-bound GEMM histories of these lengths only (ms)")
    parser.add_argument("--mixed", type=float, nargs="+", default=None, metavar="FRACTION",
                        help="--history with GEMM/copy histories spending these fractions of their time in GEMMs, "
                             "and compute-bound ones, of each of --mixed-ms")
    parser.add_argument("--mixed-ms", type=float, nargs="+", default=[70.0])
    args = parser.parse_args()
    if args.history:
        write_report(args.output or f"benchmarks/results/memory_state/history_{torch.cuda.get_device_name().replace(' ', '_')}.json",
                     reps=args.reps, rest_s=args.rest_s,
                     results=history_probe(args.reps, args.rest_s, args.compute_ms, args.mixed, args.mixed_ms))
        return 0
    if args.sequence:
        write_report(args.output or "benchmarks/results/memory_state/sequence.json", reps=args.reps,
                     results=sequence_probe(args.reps))
        return 0
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    dev = torch.device("cuda")
    # The dense decoder's prefill rows (Qwen3-32B dims, 64 x 1024 tokens; benchmarks/results/cuda_replay_reuse/).
    bf16 = {"device": dev, "dtype": torch.bfloat16}
    x = torch.randn(64, 1024, 5120, **bf16)
    weight = torch.randn(5120, **bf16)
    gate_up = torch.randn(64, 1024, 51200, **bf16)
    gate, up = gate_up[..., :25600], gate_up[..., 25600:]          # strides (52428800, 51200, 1)
    act = torch.randn(64, 1024, 25600, **bf16)
    other = torch.randn_like(act)
    q = torch.randn(64, 1024, 64, 128, **bf16).transpose(1, 2)     # (8388608, 128, 8192, 1)
    plain = torch.randn(64, 64, 1024, 128, **bf16)
    fused = torch.randn(64, 1024, 80, 128, **bf16)
    x1 = fused[:, :, :64, :64].transpose(1, 2)                      # (10485760, 128, 10240, 1)
    neg_out = torch.randn(64, 1024, 64, 64, **bf16).transpose(1, 2)  # (4194304, 64, 4096, 1)
    key = torch.randn(64, 1024, 8, 128, **bf16).transpose(1, 2)     # repeat_kv's expand: (1048576, 128, 0, 1024, 1)
    kv_source = key.unsqueeze(2).expand(64, 8, 8, 1024, 128)
    kv_dest = torch.empty(64, 8, 8, 1024, 128, **bf16)
    kernels = {"mul contiguous 64x1024x25600": lambda: torch.mul(act, other),
               "mul act x strided up slice": lambda: torch.mul(act, up),
               "silu strided gate slice": lambda: torch.nn.functional.silu(gate),
               "mul 64x1024x5120 x weight(5120)": lambda: torch.mul(x, weight),
               "add transposed q + contiguous": lambda: torch.add(q, plain),
               "cat rotate_half (workload strides)": lambda: torch.cat((neg_out, x1), dim=-1),
               "copy_ KV repeat (expanded source)": lambda: kv_dest.copy_(kv_source)}
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)

    def load(seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(8):
                torch.mm(a, b, out=c)
            torch.cuda.synchronize()

    results = []
    for name, fn in kernels.items():
        timed(fn, 3)
        for state in ("rested", "after-load"):
            if state == "rested":
                torch.cuda.synchronize()
                time.sleep(3.0)
            else:
                load(args.load_s)
            before = nvml_state(handle)
            samples = timed(fn, args.reps)
            after = nvml_state(handle)
            results.append({"kernel": name, "state": state, "median_us": statistics.median(samples),
                            "first_us": samples[0], "before": before, "after": after})
            print(f"{name:24s} {state:11s} first {samples[0]:9.1f} µs median {statistics.median(samples):9.1f} µs "
                  f"SM {before['sm_mhz']}->{after['sm_mhz']} MHz mem {before['mem_mhz']} MHz "
                  f"{before['power_w']:.0f} W {before['temp_c']}->{after['temp_c']} C", flush=True)


    print("\n| kernel | rested µs | after load µs | time ratio | SM clock ratio | time ~ clock^-e, e |")
    print("|---|---:|---:|---:|---:|---:|")
    summary = []
    for name in kernels:
        rested = next(r for r in results if r["kernel"] == name and r["state"] == "rested")
        loaded = next(r for r in results if r["kernel"] == name and r["state"] == "after-load")
        time_ratio = loaded["median_us"] / rested["median_us"]
        clock_ratio = (loaded["before"]["sm_mhz"] + loaded["after"]["sm_mhz"]) / (
            rested["before"]["sm_mhz"] + rested["after"]["sm_mhz"])
        exponent = -math.log(time_ratio) / math.log(clock_ratio) if clock_ratio != 1 else None
        summary.append({"kernel": name, "time_ratio": time_ratio, "clock_ratio": clock_ratio, "exponent": exponent})
        print(f"| {name} | {rested['median_us']:.1f} | {loaded['median_us']:.1f} | {time_ratio:.3f} | "
              f"{clock_ratio:.3f} | {exponent if exponent is None else round(exponent, 2)} |")
    write_report(args.output or f"benchmarks/results/memory_state/{torch.cuda.get_device_name().replace(' ', '_')}.json",
                 load_s=args.load_s, reps=args.reps, summary=summary, results=results)
    return 0


def write_report(path: str, **fields) -> None:
    """The JSON at `path`: the device, torch and the date (UTC) ahead of `fields`."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               **fields}, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
