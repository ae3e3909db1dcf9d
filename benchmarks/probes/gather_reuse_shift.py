#!/usr/bin/env python
"""Which rows' replayed cache state a change of the parse's reuse distances moves, on a device of a given cache.

The parse counts a gather's table (index_select, embedding, gather, index) as the rows it reads, not the whole
table (opperf/parse/reuse.py, GATHERS). This probe parses one profile twice, with the rule and without it
(GATHERS emptied), and lists every row where an LRU cache of --cache-mib holds another share of an input under the two
distances (residency.resident_bytes, what cuda's insitu state rewrites): the rows whose replay the change moves.
Every other row replays exactly as before.

    python benchmarks/probes/gather_reuse_shift.py --trace WORK/dense/profile/trace.json --cache-mib 60 \
        --output shift.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from opperf import contract  # noqa: E402
from opperf.parse import reuse  # noqa: E402
from opperf.replay.residency import MIB, parse_reuse, resident_bytes  # noqa: E402


def parse(trace: Path, target: Path) -> dict[tuple[str, int], dict]:
    from scripts.parse_kernel_details import build_parser
    from scripts.parse_kernel_details import main as parse_main

    if parse_main(build_parser().parse_args(["--profiling-path", str(trace), "--database-path", str(target)])):
        raise SystemExit(f"parse of {trace} failed")
    rows = {}
    for path in sorted(target.rglob("*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                rows[path.stem, line] = row
    return rows


def slot_bytes(row: dict) -> list[int]:
    """Each input slot's bytes from the row's shapes and dtypes (0 for a non-tensor slot)."""
    shapes = contract.parse_shapes(row.get(contract.INPUT_SHAPES, ""))
    dtypes = contract.split_slots(row.get(contract.INPUT_DTYPES, ""))
    return [int(math.prod(shape) * contract.dtype_bytes(dtype)) if shape is not None and dtype else 0
            for shape, dtype in zip(shapes, dtypes + [""] * len(shapes))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trace", type=Path, required=True, help="a workload's trace.json (execution trace beside)")
    parser.add_argument("--cache-mib", type=float, required=True, help="the replay device's cache (H200 L2: 60)")
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        with_rule = parse(args.trace, Path(scratch) / "with")
        gathers, reuse.GATHERS = reuse.GATHERS, frozenset()
        try:
            without_rule = parse(args.trace, Path(scratch) / "without")
        finally:
            reuse.GATHERS = gathers
    column = "Profiling Input Reuse Distance(MiB)"
    differing, moved = 0, []
    for key, row in with_rule.items():
        before = parse_reuse(without_rule[key].get(column))
        after = parse_reuse(row.get(column))
        if before == after:
            continue
        differing += 1
        capacity = int(args.cache_mib * MIB)
        if any(b != a and resident_bytes(n, b, capacity) != resident_bytes(n, a, capacity)
               for b, a, n in zip(before, after, slot_bytes(row)) if a is not None and b is not None):
            moved.append({"type": key[0], "line": key[1], "shapes": row.get("Input Shapes", ""),
                          "calls": row.get("Profiling Sample Count", ""),
                          "profiled_us": row.get("Profiling Average Duration(us)", ""),
                          "without_rule": without_rule[key].get(column), "with_rule": row.get(column)})
    share = sum(float(m["profiled_us"] or 0) * float(m["calls"] or 1) for m in moved)
    total = sum(float(r.get("Profiling Average Duration(us)") or 0) * float(r.get("Profiling Sample Count") or 1)
                for r in with_rule.values())
    print(f"{args.trace}: {len(with_rule)} rows, {differing} with another distance, {len(moved)} whose cache state "
          f"under {args.cache_mib:g} MiB moves ({100 * share / (total or 1):.2f} % of the profiled time)")
    for m in moved:
        print(f"  {m['type']} {m['line']} [{m['shapes']}] x{m['calls']} {m['profiled_us']} us: "
              f"{m['without_rule']} -> {m['with_rule']}")
    if args.output:
        args.output.write_text(json.dumps({"trace": str(args.trace), "cache_mib": args.cache_mib,
                                           "rows": len(with_rule), "differing": differing, "moved": moved,
                                           "moved_time_share": share / (total or 1)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
