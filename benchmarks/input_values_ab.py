"""The workload's recorded input values against replay's own draw: the table and JSON of one A/B run.

`bash benchmarks/input_values_ab_run.sh` with TYPES set (on a GPU host of the device tool) replays the kernel types
whose rows carry `Profiling Input Values` three times from the same parsed rows of each workload: `recorded`
(seeds 0 and 1) and `balanced` (the column removed: replay draws a balanced router's split, a random mask). This
script reads those replayed CSVs (`types/<workload>/<run>_<type>.csv`) and reports, per workload and type, the gap
of `Average Duration(us)` (replay) to `Profiling Average Duration(us)` (the workload): median, p90 and max over
rows, time-weighted over the profiled calls, and the median ratio; and how far the two recorded replays differ.
With `--databases DIR`, it also summarises whole replayed databases (`DIR/<workload>/insitu/data/...`, as the
script packs them) the same way, per workload, when a run's report stage did not finish.

    python benchmarks/input_values_ab.py RESULTS_DIR --device "NVIDIA H100 80GB HBM3" --date 2026-11-24
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_replay import gap_summary, write_summary  # noqa: E402

RUNS = ("balanced", "recorded", "recorded_seed1")
TYPES = ("bincount", "_grouped_mm", "histc", "masked_fill_", "where", "index", "_index_put_impl_", "index_select",
         "index_add_")
# Workloads the replay code was developed on (issue 18's meaning of `unseen`): the reference decoder's MoE.
DEVELOPMENT = {"moe"}


def _timed_rows(path: Path):
    """((shapes, strides), (replay µs, profiled µs, profiled calls)) of every row of a replayed CSV with both times."""
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            try:
                yield ((row["Input Shapes"], row.get("Input Strides", "")),
                       (float(row["Average Duration(us)"]), float(row["Profiling Average Duration(us)"]),
                        int(row["Profiling Sample Count"])))
            except (KeyError, ValueError):
                continue


def _rows(path: Path) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(shapes, strides) → (replay µs, profiled µs, profiled calls): rows of two runs matched by signature."""
    return dict(_timed_rows(path))


def database_summary(directory: Path) -> dict:
    """Every replayed row of one workload's database (all kernel types), as cuda_replay.py reports a workload."""
    pairs = [pair for path in sorted(directory.glob("insitu/data/*/*/*/*.csv")) for _, pair in _timed_rows(path)]
    return {"name": directory.name, "unseen": directory.name not in DEVELOPMENT, **gap_summary(pairs)}


def gaps(rows: dict) -> dict:
    """cuda_replay.py's summary of the rows (the same quantiles as its reports), with the largest gap."""
    pairs = list(rows.values())
    return {**gap_summary(pairs), "max_gap": max(abs(1 - r / p) for r, p, _ in pairs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the directory holding types/<workload>/<run>_<type>.csv")
    parser.add_argument("--device", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--environment", default="", help="driver, torch and CUDA versions, as one line")
    parser.add_argument("--output", type=Path, help="JSON path (default: RESULTS/input_values_ab.json)")
    parser.add_argument("--databases", type=Path, help="a directory of replayed databases, one per workload")
    args = parser.parse_args()
    entries = []
    print("| workload | type | rows | balanced: median / p90 / max gap, time-weighted (ratio) | recorded | "
          "recorded, seed 1 | recorded vs seed 1 (median) |")
    print("|---|---|---|---|---|---|---|")
    for directory in sorted((args.results / "types").iterdir()):
        for kernel_type in TYPES:
            paths = {run: directory / f"{run}_{kernel_type}.csv" for run in RUNS}
            if not all(p.is_file() for p in paths.values()):
                continue
            rows = {run: _rows(path) for run, path in paths.items()}
            runs = {run: gaps(rows[run]) for run in RUNS}
            repeat = statistics.median(abs(rows["recorded"][k][0] / rows["recorded_seed1"][k][0] - 1)
                                       for k in rows["recorded"] if k in rows["recorded_seed1"])
            entries.append({"name": directory.name, "unseen": directory.name not in DEVELOPMENT, "type": kernel_type,
                            **runs, "repeatability_median": repeat})
            cells = [f"{100 * m['median_gap']:.1f} / {100 * m['p90_gap']:.1f} / {100 * m['max_gap']:.1f} %, "
                     f"{100 * m['time_weighted_gap']:.1f} % ({m['median_ratio']:.3f})" for m in runs.values()]
            print(f"| {directory.name} | {kernel_type} | {runs['recorded']['rows']} | {' | '.join(cells)} | "
                  f"{100 * repeat:.1f} % |")
    chains = [database_summary(directory) for directory in sorted(args.databases.iterdir())] if args.databases else []
    for chain in chains:
        print(f"\n{chain['name']}: {chain['rows']} rows, median / p90 / time-weighted gap "
              f"{100 * chain['median_gap']:.1f} / {100 * chain['p90_gap']:.1f} / {100 * chain['time_weighted_gap']:.1f} %")
    document = {"device": args.device, "date": args.date, "environment": args.environment,
                "method": "scripts/replay.py per kernel type from the same parsed rows, default policies (insitu, "
                          "after-gemm), 30 repetitions; gap of Average Duration to Profiling Average Duration",
                "workloads": entries, **({"chains": chains} if chains else {})}
    return write_summary(args.output or args.results / "input_values_ab.json", document, bool(entries))


if __name__ == "__main__":
    raise SystemExit(main())
