#!/usr/bin/env python
"""How steady is the ground truth? Two profiles of one workload compared row by row, and one replay compared
with each.

Replay's gap to the profile (benchmarks/cuda_replay.py) counts the profile's own scatter as replay error: a 2 µs
kernel that a single pass of the workload calls twice has a profiled mean of two samples. This compares
databases parsed from independent profiles of the same workload (same seed, same plan, another process):

    python benchmarks/profile_repeatability.py --databases one=DB1 one_b=DB1B five=DB5 five_b=DB5B \
        --replayed DB_REPLAYED --output DIR

Rows are joined on every column that is not a measurement (type, shapes, dtypes, strides, scalars, formats).
For each pair of profiles: the median / p90 of |1 - b/a| over their common rows' `Profiling Average
Duration(us)`, overall and per profiled-time band. For --replayed (a database after scripts/replay.py): its
`Average Duration(us)` against each profile, the gap cuda_replay.py reports, so that one replay is judged by
ground truths of different steadiness. Prints a table and writes profile_repeatability.json/.md in --output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_replay import _number, quantile, read_rows  # noqa: E402
from opperf import contract  # noqa: E402

BANDS_US = ((0, 2), (2, 5), (5, 10), (10, 30), (30, 100), (100, float("inf")))
MEASURED_PREFIXES = ("Profiling ", "Replay ", contract.REPLAY_AVERAGE, "collected_at", contract.SOURCE, "_line")


def row_key(row: dict) -> tuple:
    """What identifies a row across two parses of the same workload: everything that is not a measurement."""
    return tuple(sorted((k, v) for k, v in row.items() if not k.startswith(MEASURED_PREFIXES)))


def profiled_means(database: Path) -> dict[tuple, tuple[float, int]]:
    """Row key → (profiled mean µs, calls) of the database's profiled rows."""
    out = {}
    for row in read_rows(database):
        mean = _number(row.get(contract.PROFILING_AVERAGE))
        if mean is not None and mean > 0:
            out[row_key(row)] = (mean, int(_number(row.get(contract.PROFILING_SAMPLE_COUNT)) or 1))
    return out


def replayed_means(database: Path) -> dict[tuple, float]:
    out = {}
    for row in read_rows(database):
        value = _number(row.get(contract.REPLAY_AVERAGE))
        if row.get(contract.REPLAY_STATUS) == "ok" and value is not None and value > 0:
            out[row_key(row)] = value
    return out


def compare(measured: dict[tuple, float], truth: dict[tuple, tuple[float, int]]) -> dict:
    """Gap |1 - measured/truth| over the common rows, overall and per band of the truth's time."""
    common = [(measured[k], truth[k][0]) for k in measured.keys() & truth.keys()]

    def summary(pairs):
        gaps = [abs(1 - m / t) for m, t in pairs]
        return {"rows": len(pairs), "median_gap": quantile(gaps, 0.5), "p90_gap": quantile(gaps, 0.9)}

    return {**summary(common),
            "bands": {f"{low}-{high}" if high != float("inf") else f">{low}":
                      summary([(m, t) for m, t in common if low <= t < high]) for low, high in BANDS_US}}


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def markdown(result: dict) -> str:
    bands = [f"{low}-{high} µs" if high != float("inf") else f">{low} µs" for low, high in BANDS_US]
    lines = ["| compared | rows | median gap | p90 gap | " + " | ".join(f"{b}: p90 (rows)" for b in bands) + " |",
             "|---|---|---|---|" + "---|" * len(bands)]
    for name, entry in result["comparisons"].items():
        cells = [f"{_pct(b['p90_gap'])} ({b['rows']})" for b in entry["bands"].values()]
        lines.append(f"| {name} | {entry['rows']} | {_pct(entry['median_gap'])} | {_pct(entry['p90_gap'])} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Rows per profile and median calls per row: " + ", ".join(
        f"{n} {p['rows']} rows, {p['median_calls']} calls" for n, p in result["profiles"].items())]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--databases", nargs="+", required=True, metavar="NAME=DB",
                        help="parsed databases (data/{device}/torch/{version}) of independent profiles")
    parser.add_argument("--replayed", nargs="*", default=[], metavar="NAME=DB",
                        help="databases after scripts/replay.py, compared with each profile")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    def named(items):
        pairs = [item.split("=", 1) for item in items]
        bad = [item for item, pair in zip(items, pairs) if len(pair) != 2 or not Path(pair[1]).is_dir()]
        if bad:
            parser.error(f"expected NAME=DIRECTORY with an existing directory: {bad}")
        return {name: Path(path) for name, path in pairs}

    profiles = {name: profiled_means(path) for name, path in named(args.databases).items()}
    replays = {name: replayed_means(path) for name, path in named(args.replayed).items()}
    result = {"profiles": {n: {"rows": len(p), "median_calls": quantile([c for _, c in p.values()], 0.5)}
                           for n, p in profiles.items()},
              "comparisons": {}}
    for (a, truth_a), (b, truth_b) in itertools.combinations(profiles.items(), 2):
        result["comparisons"][f"profile {b} vs profile {a}"] = compare({k: v for k, (v, _) in truth_b.items()},
                                                                       truth_a)
    for name, measured in replays.items():
        for truth_name, truth in profiles.items():
            result["comparisons"][f"replay {name} vs profile {truth_name}"] = compare(measured, truth)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "profile_repeatability.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    text = markdown(result)
    (args.output / "profile_repeatability.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
