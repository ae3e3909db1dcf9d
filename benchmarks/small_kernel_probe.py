"""Where the small kernels' replay error comes from: the same rows timed after different neighbourhoods.

Kernels of 1.5-30 µs replay 5-9 % faster than inside the workload (median over four transformers workloads on an
H100, benchmarks/results/cuda_replay_transformers/). Replay times each call right behind its cache preparation
(insitu: read 2x L2, rewrite the warm inputs), on a busy GPU. Inside a model the call follows other kernels: in a
CPU-bound decode step the GPU waits for each launch, in a prefill the call queues behind a long GEMM whose output
fills L2 with dirty lines. This probe replays the rows of parsed databases (profiled < --max-us) through the
replay stage's own code (opperf.replay.engine, CUPTI kernel time, 30 calls) under preconditions:

  insitu   replay's default (flush by reading, warm inputs rewritten)
  idle     insitu, then the host waits until the GPU is idle and --idle-us more before launching the call
  dirty    flush, then an L2-sized buffer written (dirty lines a kernel's output leaves), then the warm inputs
  gemm     flush, a 4096^3 bf16 GEMM (a long kernel's power draw and dirty output), then the warm inputs
  gemm-small  the same with a 1024^3 GEMM (~5 µs: the GEMM's code and dirty output, little power)
  cold     gemm with no input rewritten (every input as cold as the weights: produced before a weight stream)
  tlb      gemm, then one 4-byte read every 64 KiB of a --sweep-gb buffer (a model's weights streamed between
           the call's inputs being written and the call: the GPU's address translations of everything else gone),
           then the warm inputs (their pages translated again, as just written; the output's not)

and prints, per precondition, the median replay/profiled ratio and median gap per duration band and kernel type,
and writes benchmarks/results/small_kernels/<device>.json.

    python benchmarks/small_kernel_probe.py DB_DIR [DB_DIR ...] [--max-us 30] [--variants insitu idle dirty gemm]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from row_probe import profiled_rows, ratio_summary, time_rows, write_result  # noqa: E402  (beside this script)

from opperf.replay.timing import CacheState  # noqa: E402

BANDS = ((0, 1.5), (1.5, 2), (2, 3), (3, 5), (5, 10), (10, 30), (30, 1e9))


class Neighbourhood(CacheState):
    """The insitu cache state plus what the workload ran before the call (see the module docstring)."""

    def __init__(self, device, l2_bytes: int, variant: str, idle_us: float, sweep_gb: float = 16.0):
        super().__init__(device, "insitu", l2_bytes)
        self.variant, self.idle_s = variant, idle_us / 1e6
        self._dirty = torch.empty(l2_bytes // 4, dtype=torch.int32, device=device) if variant == "dirty" else None
        self._gemm = None
        self._sweep = None
        if variant == "tlb":
            pages = torch.zeros(int(sweep_gb * 2**30) // 4, dtype=torch.int32, device=device)
            self._sweep = (pages, pages[:: 2**16 // 4], torch.empty((), dtype=torch.int64, device=device))
        if variant in ("gemm", "gemm-small", "tlb", "cold"):
            n = 4096 if variant == "gemm" else 1024
            a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
            self._gemm = (a, a.clone(), torch.empty_like(a))

    def prepare(self, views, neighbour=None):  # the timer's own neighbour is off (cooldown): the variant is it
        self.flush()
        if self._dirty is not None:
            self._dirty.fill_(1)
        if self._gemm is not None:
            torch.mm(self._gemm[0], self._gemm[1], out=self._gemm[2])
        if self._sweep is not None:
            torch.sum(self._sweep[1], dim=0, out=self._sweep[2])
        for view in views if self.variant != "cold" else ():
            view.mul_(1)
        if self.variant == "idle":
            torch.cuda.synchronize(self.device)
            deadline = time.perf_counter() + self.idle_s
            while time.perf_counter() < deadline:
                pass


def rows_of(db_dirs, max_us):
    for db, kernel_type, line, row, profiled in profiled_rows(db_dirs):
        if profiled < max_us:
            yield db.resolve().parents[4].name, kernel_type, line, row, profiled


def band_of(us):
    return next(f"{lo}-{hi if hi < 1e9 else 'inf'}" for lo, hi in BANDS if lo <= us < hi)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("databases", nargs="+")
    parser.add_argument("--max-us", type=float, default=30.0)
    parser.add_argument("--variants", nargs="+", default=["insitu", "idle", "dirty", "gemm"],
                        choices=["insitu", "idle", "dirty", "gemm", "gemm-small", "tlb", "cold"])
    parser.add_argument("--sweep-gb", type=float, default=16.0, help="tlb: the buffer swept (default %(default)s)")
    parser.add_argument("--idle-us", type=float, default=20.0)
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "small_kernels"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = list(rows_of(args.databases, args.max_us))
    recipes, results, failures = {}, [], []
    for variant in args.variants:
        time_rows(((kernel_type, line, row, {"workload": workload, "profiled_us": profiled})
                   for workload, kernel_type, line, row, profiled in rows),
                  lambda timer, variant=variant: Neighbourhood(timer.device, timer.cache.l2_bytes, variant,
                                                               args.idle_us, args.sweep_gb),
                  variant, args.repeat_count, recipes, results, failures, batch=128)
    if failures:
        print(f"{len(failures)} row(s) not measured, first: {failures[0]}", flush=True)

    table = {}
    for variant in args.variants:
        mine = [r for r in results if r["variant"] == variant]
        table[variant] = {"all": ratio_summary(mine),
                          "bands": {band_of(lo): ratio_summary([r for r in mine if lo <= r["profiled_us"] < hi])
                                    for lo, hi in BANDS if any(lo <= r["profiled_us"] < hi for r in mine)},
                          "types": {t: ratio_summary([r for r in mine if r["type"] == t])
                                    for t in sorted({r["type"] for r in mine})}}
    bands = [band_of(lo) for lo, _ in BANDS]
    print(f"{'band (µs)':<10} " + " ".join(f"{v + ' ratio/gap':>20}" for v in args.variants))
    for band in [*bands, "all"]:
        cells = []
        for variant in args.variants:
            s = table[variant]["all"] if band == "all" else table[variant]["bands"].get(band)
            cells.append(f"{s['median_ratio']:>9.3f} /{s['median_gap']:>7.1%} ({s['rows']:>3})" if s and s["rows"]
                         else f"{'-':>20}")
        print(f"{band:<10} " + " ".join(cells))
    write_result(args.output, "small_kernel_probe.py", table, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
