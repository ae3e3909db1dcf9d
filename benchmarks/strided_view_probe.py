"""What the insitu cache state should make resident of a sparse strided input: the bytes it spans, or its elements.

The reference decoder's rotary rows read halves of q and k that are slices of the fused QKV output (a row of
9,216 elements of which the slice is 64): their inputs span 2-36 times their own bytes. Until 2026-11-28 insitu
rewrote the tail of that span from a twin, at 4,096 tokens 75 MB through a 60 MiB L2, and those rows replayed
colder than inside the workload (the reference MoE's rotary `neg` 1.29, `cat` 1.16; docs/replay.md). This probe
replays the database rows that have such an input (span over --min-span times the elements, no stride 0)
through the replay stage's own code (opperf.replay.engine, CUPTI kernel time, 30 calls), under:

  span          the old insitu: the last bytes of the span the reuse distance leaves, copied from a twin
  view          the view's own elements (their last rows by the reuse distance), copied from a twin
  view-inplace  the same elements rewritten in place (no twin read through the cache)

  default       insitu as it is: `view` for inputs spanning more than SPARSE_VIEW_SPAN times their elements, else
                `span` (chosen from this probe's first run, benchmarks/results/strided_views/README.md)

and prints per variant and kernel type the median replay/profiled ratio and gap, and writes
benchmarks/results/strided_views/<device>.json.

    python benchmarks/strided_view_probe.py DB_DIR [DB_DIR ...] [--variants span view view-inplace]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from row_probe import profiled_rows, ratio_summary, time_rows, write_result  # noqa: E402  (beside this script)

from opperf import contract  # noqa: E402
from opperf.replay.inputs import storage_extent  # noqa: E402
from opperf.replay.timing import CacheState, storage_bytes_view, warm_target  # noqa: E402

VARIANTS = ("span", "view", "view-inplace", "default")


class Variant(CacheState):
    """The insitu cache state with the warm target of one variant (see the module docstring)."""

    def __init__(self, device, l2_bytes: int, variant: str, min_span: float):
        super().__init__(device, "insitu", l2_bytes)
        self.variant = variant
        if variant == "span":
            self.warm_target = storage_bytes_view
        elif variant != "default":
            self.warm_target = functools.partial(warm_target, span=min_span)

    def plan(self, case):
        planned = super().plan(case)
        if self.variant == "view-inplace":
            self._twins = {}
        return planned


def sparse_span(row: dict) -> float:
    """The largest span / elements ratio of the row's strided inputs with no stride 0 (0: none)."""
    shapes = contract.parse_shapes(row.get(contract.INPUT_SHAPES, ""))
    worst = 0.0
    for shape, slot in zip(shapes, contract.split_slots(contract.strip_profiler_quotes(
            row.get(contract.INPUT_STRIDES, "")))):
        strides = contract.parse_strides(slot) if slot else None
        if not shape or not strides or len(strides) != len(shape) or any(
                s == 0 for d, s in zip(shape, strides) if d > 1):
            continue
        worst = max(worst, storage_extent(shape, strides) / max(1, math.prod(shape)))
    return worst


def rows_of(db_dirs, min_span):
    for db, kernel_type, line, row, profiled in profiled_rows(db_dirs):
        span = sparse_span(row)
        if span > min_span:
            yield str(db), kernel_type, line, row, profiled, span


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("databases", nargs="+")
    parser.add_argument("--variants", nargs="+", default=["span", "view", "view-inplace"], choices=VARIANTS)
    parser.add_argument("--min-span", type=float, default=2.0,
                        help="rows with an input spanning more than this many times its elements (default %(default)s;"
                             " insitu warms element-wise above opperf.replay.timing.SPARSE_VIEW_SPAN)")
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--output", default=str(REPO / "benchmarks" / "results" / "strided_views"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    rows = list(rows_of(args.databases, args.min_span))
    print(f"{len(rows)} rows with a sparse strided input in {len(args.databases)} database(s)", flush=True)
    recipes, results, failures = {}, [], []
    for variant in args.variants:
        time_rows(((kernel_type, line, row, {"database": database, "shapes": row.get(contract.INPUT_SHAPES),
                                              "span_ratio": round(span, 2), "profiled_us": profiled})
                   for database, kernel_type, line, row, profiled, span in rows),
                  lambda timer, variant=variant: Variant(timer.device, timer.cache.l2_bytes, variant, args.min_span),
                  variant, args.repeat_count, recipes, results, failures)
    for failure in failures:
        print(f"not measured: {failure}", flush=True)

    table = {variant: {"all": ratio_summary([r for r in results if r["variant"] == variant]),
                       "types": {t: ratio_summary([r for r in results if r["variant"] == variant and r["type"] == t])
                                 for t in sorted({r["type"] for r in results})}}
             for variant in args.variants}
    print(f"{'kernel type':<12} " + " ".join(f"{v + ' ratio / gap / max':>32}" for v in args.variants))
    for name in [*sorted({r["type"] for r in results}), "all"]:
        cells = []
        for variant in args.variants:
            s = table[variant]["all"] if name == "all" else table[variant]["types"].get(name)
            cells.append(f"{s['median_ratio']:>9.3f} /{s['median_gap']:>7.1%} /{s['max_gap']:>7.1%} ({s['rows']:>3})"
                         if s and s["rows"] else f"{'-':>32}")
        print(f"{name:<12} " + " ".join(cells))
    write_result(args.output, "strided_view_probe.py", table, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
