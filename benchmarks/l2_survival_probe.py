"""How much of a just-written tensor does the GPU's L2 still hold after D bytes of other traffic?

Replay's insitu cache state holds in L2 what an LRU cache of the device's L2 size would still hold of each input,
given the row's reuse distance (opperf.replay.residency). On the H100, rows whose input distance is 1-1.7 times
the L2 size replay 13-45 % slow (the LRU model calls them cold; the workload found them partly resident), and rows
at 0.6-0.9 times replay a few % fast (benchmarks/results/cuda_replay_reuse/). This probe measures the survival
curve itself: write X, touch D bytes of other data (D counted as the parse counts a reuse distance: the sizes of
the distinct tensors the traffic uses), then time one kernel that reads X. The resident fraction at D is
(t_cold - t_D) / (t_cold - t_warm), with t_warm at D = 0 and t_cold after a read stream of four L2 sizes.

Traffic kinds: a read stream (a sum), a copy (read and write), a decode-size GEMM (64 rows, the weight streamed
once) and a prefill-size GEMM (4,096 rows, compute-bound). Kernels timed: X.sum() and neg(X) into a fixed output.

    python benchmarks/l2_survival_probe.py [--output-dir benchmarks/results/l2_survival]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from device_result import write_device_result
from memory_state_probe import timed as event_times

FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
MIB = 2**20


def timed(fn, before, reps: int) -> float:
    """Median CUDA-event time (µs) of fn over `reps` calls, `before()` enqueued (untimed) ahead of each.

    A spin of ~0.2 ms goes first, so that the CPU has enqueued the start event, fn and the end event before the
    GPU reaches them: the interval is then fn's kernel alone, not the CPU's launch latency."""
    return statistics.median(event_times(fn, reps, before=lambda: (torch.cuda._sleep(400_000), before())))


class Traffic:
    """D bytes of other data touched, one kind at a time, from a pool larger than any D asked for."""

    def __init__(self, l2_bytes: int):
        self.l2 = l2_bytes
        self.pool = torch.empty(5 * l2_bytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        self.out = torch.empty_like(self.pool)
        self.k = 8192
        self.act = {m: torch.randn(m, self.k, dtype=torch.bfloat16, device="cuda") for m in (64, 4096)}

    def run(self, kind: str, nbytes: int) -> None:
        if nbytes <= 0:
            return
        if kind == "read":
            self.pool[:nbytes // 2].sum()
        elif kind == "copy":                     # half read, half written: D bytes of distinct tensors
            n = nbytes // 4
            self.out[:n].copy_(self.pool[:n])
        else:                                    # weight K x N, activations M x K, output M x N: D in all
            m = 64 if kind == "decode_gemm" else 4096
            n = max(1, (nbytes // 2 - m * self.k) // (self.k + m))
            weight = self.pool[:self.k * n].view(self.k, n)
            torch.mm(self.act[m], weight, out=self.out[:m * n].view(m, n))


def measure(size_mib: int, kinds, reps: int) -> list[dict]:
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    traffic = Traffic(l2)
    x_source = torch.randn(size_mib * MIB // 2, dtype=torch.bfloat16, device="cuda")
    x = torch.empty_like(x_source)
    y = torch.empty_like(x_source)
    kernels = {"sum": lambda: x.sum(), "neg": lambda: torch.neg(x, out=y)}
    rows = []
    for kernel, fn in kernels.items():
        cold = timed(fn, lambda: (x.copy_(x_source), traffic.run("read", 4 * l2)), reps)
        warm = timed(fn, lambda: x.copy_(x_source), reps)
        for kind in kinds:
            for fraction in FRACTIONS:
                distance = int(fraction * l2)
                t = timed(fn, lambda: (x.copy_(x_source), traffic.run(kind, distance)), reps)
                resident = (cold - t) / (cold - warm) if cold > warm else float("nan")
                lru = min(1.0, max(0.0, (l2 - distance) / (size_mib * MIB)))
                rows.append({"kernel": kernel, "x_mib": size_mib, "traffic": kind, "distance_over_l2": fraction,
                             "time_us": round(t, 3), "warm_us": round(warm, 3), "cold_us": round(cold, 3),
                             "resident_fraction": round(resident, 3), "lru_fraction": round(lru, 3)})
                print(f"{kernel:4} X {size_mib:3} MiB  {kind:12} D/L2 {fraction:4.2f}: {t:8.2f} µs "
                      f"(warm {warm:.2f}, cold {cold:.2f})  resident {resident:5.2f}  LRU {lru:4.2f}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="benchmarks/results/l2_survival")
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[8, 24])
    parser.add_argument("--traffic", nargs="+", default=["read", "copy", "decode_gemm", "prefill_gemm"])
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = [row for size in args.sizes_mib for row in measure(size, args.traffic, args.reps)]
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    write_device_result(args.output_dir, "l2_survival_probe.py", l2_bytes=l2, fractions=list(FRACTIONS),
                        reps=args.reps, rows=rows)


if __name__ == "__main__":
    main()
