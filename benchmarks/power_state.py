#!/usr/bin/env python
"""The power state a workload ran in against the one its replay ran in, per row, and what it does to the gap.

Input: a replayed database directory of a CUDA profile taken with the NVML sampler (rows carry `Profiling
Average SM Clock(MHz)` / `Power(W)` from the parse and `Replay SM Clock(MHz)` / `Power(W)` from the replay).
Rows are binned by the SM clock their kernels ran at inside the workload; per bin the median replay/profiled
duration ratio and the replay clock say whether replay runs faster where the workload ran slower clocks.

On the GPU host (profile, parse, replay of the profiled rows; see benchmarks/results/cuda_power_state/):

    python benchmarks/cuda_database.py --output-dir X --work-dir W --model Llama-3-70B --stages profile parse
    python scripts/replay.py --database-path W/data/H100/torch/torch2.11.0_cuda13.0 --backend cuda --device H100
    python benchmarks/power_state.py W/data/H100/torch/torch2.11.0_cuda13.0 --json power_state.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROFILED_CLOCK = "Profiling Average SM Clock(MHz)"
PROFILED_POWER = "Profiling Average Power(W)"
REPLAY_CLOCK = "Replay SM Clock(MHz)"
REPLAY_POWER = "Replay Power(W)"
CLOCK_BINS = ((0, 1800), (1800, 1950), (1950, 10_000))
LARGE_US = 20.0


def _float(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None


def load_rows(directory: Path) -> list[dict]:
    from opperf.io import read_database_csv

    rows = []
    for path in sorted(directory.glob("*.csv")):
        for row in read_database_csv(path).to_dict("records"):
            profiled, replayed = _float(row.get("Profiling Median Duration(us)")), _float(
                row.get("Replay Median Duration(us)"))
            if row.get("Replay Status") != "ok" or not profiled or not replayed:
                continue
            rows.append({"kernel_type": path.stem, "profiled_us": profiled, "replay_us": replayed,
                         "ratio": replayed / profiled, "profiled_clock": _float(row.get(PROFILED_CLOCK)),
                         "replay_clock": _float(row.get(REPLAY_CLOCK)), "profiled_power": _float(row.get(PROFILED_POWER)),
                         "replay_power": _float(row.get(REPLAY_POWER)), "calls": int(_float(row.get(
                             "Profiling Sample Count")) or 1)})
    return rows


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 4) if values else None


def summarise(rows: list[dict]) -> dict:
    with_clock = [r for r in rows if r["profiled_clock"] is not None and r["replay_clock"] is not None]
    bins = []
    for low, high in CLOCK_BINS:
        chosen = [r for r in with_clock if low <= r["profiled_clock"] < high]
        large = [r for r in chosen if r["profiled_us"] >= LARGE_US]
        bins.append({"profiled_clock_mhz": [low, high], "rows": len(chosen),
                     "median_ratio": _median(r["ratio"] for r in chosen),
                     "large_rows": len(large), "large_median_ratio": _median(r["ratio"] for r in large),
                     "replay_clock_median": _median(r["replay_clock"] for r in chosen)})
    per_type = {}
    for kernel_type in sorted({r["kernel_type"] for r in rows}):
        chosen = [r for r in rows if r["kernel_type"] == kernel_type]
        per_type[kernel_type] = {"rows": len(chosen), "median_ratio": _median(r["ratio"] for r in chosen),
                                 "profiled_clock_median": _median(r["profiled_clock"] for r in chosen),
                                 "replay_clock_median": _median(r["replay_clock"] for r in chosen)}
    gaps = sorted(abs(r["ratio"] - 1) for r in rows)
    return {"rows": len(rows), "rows_with_clock": len(with_clock),
            "median_gap": _median(gaps), "p90_gap": round(gaps[int(0.9 * (len(gaps) - 1))], 4) if gaps else None,
            "profiled_clock_range": [min(r["profiled_clock"] for r in with_clock),
                                     max(r["profiled_clock"] for r in with_clock)] if with_clock else None,
            "replay_clock_range": [min(r["replay_clock"] for r in with_clock),
                                   max(r["replay_clock"] for r in with_clock)] if with_clock else None,
            "by_profiled_clock": bins, "by_kernel_type": per_type}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("database", type=Path, help="replayed rows of a CUDA profile taken with the NVML sampler")
    parser.add_argument("--device", default="", help="device name for the JSON")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    summary = summarise(load_rows(args.database))
    if not summary["rows_with_clock"]:
        raise SystemExit(f"{args.database}: no row has both {PROFILED_CLOCK!r} and {REPLAY_CLOCK!r} (profile without "
                         "the NVML sampler, or replay without NVML)")
    print(f"{summary['rows']} rows; median |gap| {summary['median_gap']}, p90 {summary['p90_gap']}; profiled SM clock "
          f"{summary['profiled_clock_range']} MHz, replay {summary['replay_clock_range']} MHz")
    print(f"{'profiled clock (MHz)':22} {'rows':>5} {'replay/profiled':>16} {'rows >=20us':>12} {'ratio':>7} "
          f"{'replay clock':>13}")
    for item in summary["by_profiled_clock"]:
        low, high = item["profiled_clock_mhz"]
        print(f"{f'{low}..{high}':22} {item['rows']:>5} {item['median_ratio']!s:>16} {item['large_rows']:>12} "
              f"{item['large_median_ratio']!s:>7} {item['replay_clock_median']!s:>13}")
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "database": str(args.database), **summary},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
