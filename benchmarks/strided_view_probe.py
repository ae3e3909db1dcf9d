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
import csv
import datetime
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opperf import contract  # noqa: E402
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR  # noqa: E402
from opperf.replay.engine import STATUS_OK, RowOutcome, measure_prepared, prepare_row  # noqa: E402
from opperf.replay.inputs import storage_extent  # noqa: E402
from opperf.replay.job import find_definition, recipe_for  # noqa: E402
from opperf.replay.timing import CacheState, CudaTimer, storage_bytes_view, warm_target  # noqa: E402

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
    for db in db_dirs:
        for path in sorted(Path(db).glob("*.csv")):
            with path.open(newline="") as handle:
                for line, row in enumerate(csv.DictReader(handle), start=2):
                    try:
                        profiled = float(row.get(contract.PROFILING_AVERAGE) or "nan")
                    except ValueError:
                        continue
                    span = sparse_span(row)
                    if profiled == profiled and span > min_span:
                        yield str(db), path.stem, line, row, profiled, span


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
        timer = CudaTimer("cuda", power_policy="cooldown")
        timer.cache = Variant(timer.device, timer.cache.l2_bytes, variant, args.min_span)
        started, pending = time.monotonic(), []

        def collect():
            timings = timer.collect()
            for prepared, key, meta in pending:
                outcome = prepared.outcome(timings.get(key))
                if outcome.status == STATUS_OK:
                    replay = float(outcome.columns[contract.REPLAY_AVERAGE])
                    results.append({**meta, "replay_us": replay, "ratio": replay / meta["profiled_us"],
                                    "method": outcome.columns.get(contract.REPLAY_TIMING_METHOD, "")})
                else:
                    failures.append(f"{variant} {meta['type']}:{meta['line']} {outcome.status} {outcome.error}")
            pending.clear()

        for key, (database, kernel_type, line, row, profiled, span) in enumerate(rows):
            if kernel_type not in recipes:
                recipes[kernel_type] = recipe_for(kernel_type, "cuda", find_definition(
                    kernel_type, "cuda", DEFAULT_DEFINITIONS_DIR))
            if recipes[kernel_type] is None:
                continue
            prepared = prepare_row(recipes[kernel_type], row, backend="cuda", device="cuda", timer=timer, line=line)
            failed = prepared if isinstance(prepared, RowOutcome) else measure_prepared(
                prepared, timer, key, repeat_count=args.repeat_count, warmup_count=3)
            if failed is not None:
                failures.append(f"{variant} {kernel_type}:{line} {failed.status} {failed.error}")
                continue
            pending.append((prepared, key, {"variant": variant, "database": database, "type": kernel_type,
                                            "line": line, "shapes": row.get(contract.INPUT_SHAPES),
                                            "span_ratio": round(span, 2), "profiled_us": profiled}))
            if len(pending) >= 64:
                collect()
        collect()
        print(f"{variant}: {sum(r['variant'] == variant for r in results)} rows in {time.monotonic() - started:.0f} s",
              flush=True)
    for failure in failures:
        print(f"not measured: {failure}", flush=True)

    def summary(selected):
        ratios = [r["ratio"] for r in selected]
        return {"rows": len(ratios), "median_ratio": statistics.median(ratios) if ratios else None,
                "median_gap": statistics.median(abs(1 - x) for x in ratios) if ratios else None,
                "max_gap": max((abs(1 - x) for x in ratios), default=None)}

    table = {variant: {"all": summary([r for r in results if r["variant"] == variant]),
                       "types": {t: summary([r for r in results if r["variant"] == variant and r["type"] == t])
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
    device = torch.cuda.get_device_name()
    output = Path(args.output)
    output.mkdir(parents=True, exist_ok=True)
    path = output / f"{device.replace(' ', '_')}.json"
    path.write_text(json.dumps({"device": device, "torch": torch.__version__, "date": datetime.date.today().isoformat(),
                                "command": "python benchmarks/strided_view_probe.py " + " ".join(sys.argv[1:]),
                                "summary": table, "rows": results}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
