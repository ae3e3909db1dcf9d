#!/usr/bin/env python
"""Issue 18's figures of a database whose rows take their whole-trace, in-order mean above a row length.

`benchmarks/phase_replay.py --shapes` (no prefixes) replays every call of a profile once, in the trace's order, and
writes each row's in-order mean (`phase_us`) beside its profiled one. This script puts that mean in place of the
one-at-a-time replay (`Replay Average Duration(us)`) of every row whose profiled mean is at least each of
--min-row-us, keeps the one-at-a-time value for the others, and reports the median / p90 / time-weighted gap, the
large elementwise rows' ratio and the kernel types over the per-type gate (benchmarks/cuda_replay.py's own
definitions), as a markdown table and a JSON file. Without --whole it reports a database stage 4b folded, as folded
and as replayed one at a time (`Replay Isolated Average Duration(us)`):

    python benchmarks/whole_order_gaps.py --database DB_DIR --whole whole_warm_dense.json whole_plain_dense.json \\
        --min-row-us 0 3 10 20 inf --output gaps.json
    python benchmarks/whole_order_gaps.py --database FOLDED_DB_DIR
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuda_replay import analyse_run, gates, large_elementwise, read_rows  # noqa: E402  (beside this script)

from opperf import contract  # noqa: E402
from opperf.replay.phase_table import row_key  # noqa: E402


def with_order(rows: list[dict], whole: dict, min_row_us: float) -> list[dict]:
    """The rows, those with a profiled mean of at least `min_row_us` taking their in-order mean."""
    in_order = {tuple(entry["key"]): entry["phase_us"] for entry in whole["table"]}
    result = []
    for row in rows:
        key = row_key(row["_type"], row)
        profiled = float(row.get(contract.PROFILING_AVERAGE) or 0)
        if key in in_order and profiled >= min_row_us:
            row = {**row, contract.REPLAY_AVERAGE: str(in_order[key])}
        result.append(row)
    return result


def figures(rows: list[dict]) -> dict:
    run = analyse_run(rows)
    entry = {"median_gap": run["median_gap"], "p90_gap": run["p90_gap"],
             "time_weighted_gap": run["time_weighted_gap"], **large_elementwise(rows)}
    result = gates(entry, run["per_type"])
    over = result["type_median_gap"]["value"]
    return {**entry, "types_over": over, "rows": run["rows"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database", type=Path, required=True, help="the replayed database directory (*.csv)")
    parser.add_argument("--whole", type=Path, nargs="+", default=[], help="benchmarks/phase_replay.py JSONs")
    parser.add_argument("--min-row-us", type=float, nargs="+", default=[0.0, 3.0, 10.0, 20.0, math.inf])
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    folded = [r for r in read_rows(args.database)
              if r.get(contract.SOURCE, contract.SOURCE_PROFILED) == contract.SOURCE_PROFILED]
    if not folded:
        raise SystemExit(f"{args.database}: no profiled rows (*.csv)")
    # One at a time as the base: a database stage 4b folded keeps that value in its own column.
    rows = [{**r, contract.REPLAY_AVERAGE: r.get(contract.REPLAY_ISOLATED_AVERAGE) or r.get(contract.REPLAY_AVERAGE)}
            for r in folded]
    results = []
    print("| in-order run | rows from it: profiled mean ≥ | median | p90 | time-weighted | large elementwise | "
          "types over 5 % |")
    print("|---|---|---|---|---|---|---|")

    def report(name: str, label: str, result: dict) -> None:
        results.append(result)
        types = ", ".join(f"{t} {100 * v:.1f} %" for t, v in sorted(result["types_over"].items())) or "none"
        ratio = result["large_elementwise_ratio"]
        print(f"| {name} | {label} | {100 * result['median_gap']:.1f} % | {100 * result['p90_gap']:.1f} % | "
              f"{100 * result['time_weighted_gap']:.1f} % | {f'{ratio:.3f}' if ratio else '-'} | {types} |")

    if not args.whole:
        report("stage 4b, as folded", "every row it applied", {"whole": None, **figures(folded)})
        report("stage 4b, as folded", "none (one at a time)", {"whole": None, **figures(rows)})
    for path in args.whole:
        whole = json.loads(path.read_text())
        for threshold in args.min_row_us:
            report(path.stem, "none (one at a time)" if math.isinf(threshold) else f"{threshold:g} µs",
                   {"whole": str(path), "warm_inputs": whole.get("warm_inputs", False), "min_row_us": threshold,
                    **figures(with_order(rows, whole, threshold))})
    if args.output:
        args.output.write_text(json.dumps({"database": str(args.database), "results": results}, indent=1,
                                          default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
