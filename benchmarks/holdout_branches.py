#!/usr/bin/env python
"""Which holdout points of a database cross the vectorised-block boundary of an elementwise kernel (issue 19).

`scripts/check_database.py` predicts every interior replayed row from its neighbours by msmodeling's runtime rule
(opperf.database.interpolation.holdout_errors). On an H100, bf16 elementwise kernels of 1-2 µs take ~1.2 µs when
their element count is a whole number of 1,024-element blocks (the vectorised path only) and up to ~1.6 µs with a
tail (N = 1,023, 2,047, 3,000: `benchmarks/results/cuda_database/README.md`). The V1 density standard says the
PAD_TOKENS axis is set by such remainders and forbids interpolating across execution branches. This script splits
each kernel type's legal holdout points: those whose target and two neighbours lie on one side of that boundary
(axis value a multiple of BLOCK or not, all three alike) and those that mix both. It changes no gate; it says how
much of a type's error the boundary accounts for.

    python benchmarks/holdout_branches.py DATABASE_DIR [--types rsqrt add neg clone _to_copy] [--json OUT]

The database is a directory of kernel CSVs and its op_mapping.yaml (e.g. `database.tar.gz` of
benchmarks/results/cuda_database/, unpacked). The axis is the runtime's (the leading dim for generic compute):
for (1, N, 1) rows it is the element count, for others a proxy of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opperf.database.interpolation import holdout_errors  # noqa: E402

BLOCK = 1024          # elements per block of the vectorised kernel for 2-byte dtypes (16-byte loads x 128 threads)
TYPES = ("rsqrt", "add", "neg", "clone", "_to_copy")


def crosses(point) -> bool:
    """Whether a holdout point's target and neighbours lie on both sides of the block boundary."""
    return len({int(value) % BLOCK == 0 for value in (point.value, point.lower, point.upper)}) > 1


def split(points) -> dict:
    """Counts and p90s of the legal points, all and by whether they cross the block boundary."""
    legal = [p for p in points if p.legal]
    crossing = [p for p in legal if crosses(p)]
    same = [p for p in legal if not crosses(p)]

    def p90(group):
        return float(np.percentile([p.relative_error for p in group], 90)) if group else None

    over = [p for p in legal if p.relative_error > 0.10]
    return {"points": len(legal), "p90": p90(legal), "over_10pct": len(over),
            "over_10pct_crossing": sum(1 for p in over if crosses(p)),
            "crossing": len(crossing), "crossing_p90": p90(crossing), "same_side": len(same), "same_side_p90": p90(same),
            "worst": [{"value": p.value, "lower": p.lower, "upper": p.upper, "error": round(p.relative_error, 4),
                       "bucket": p.bucket} for p in sorted(over, key=lambda p: -p.relative_error)[:5]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("database", type=Path)
    parser.add_argument("--types", nargs="+", default=list(TYPES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    mapping_path = args.database / "op_mapping.yaml"
    if not mapping_path.is_file():
        print(f"{args.database}: no op_mapping.yaml (not a database directory)", file=sys.stderr)
        return 1
    op_mapping = yaml.safe_load(mapping_path.read_text(encoding="utf-8"))
    result = {}
    print("| type | legal points | p90 | over 10 % | of them crossing | crossing: points, p90 | same side: points, p90 |")
    print("|---|---|---|---|---|---|---|")
    for kernel_type in args.types:
        path = args.database / f"{kernel_type}.csv"
        if not path.is_file():
            continue
        entry = split(holdout_errors(pd.read_csv(path), kernel_type, op_mapping))
        result[kernel_type] = entry

        def pct(value):
            return "-" if value is None else f"{100 * value:.1f} %"
        print(f"| {kernel_type} | {entry['points']} | {pct(entry['p90'])} | {entry['over_10pct']} | "
              f"{entry['over_10pct_crossing']} | {entry['crossing']}, {pct(entry['crossing_p90'])} | "
              f"{entry['same_side']}, {pct(entry['same_side_p90'])} |")
    if args.json:
        args.json.write_text(json.dumps({"database": str(args.database), "block": BLOCK, "types": result}, indent=1)
                             + "\n", encoding="utf-8")
        print(f"\nwritten to {args.json}")
    return 0 if result else 1


if __name__ == "__main__":
    raise SystemExit(main())
