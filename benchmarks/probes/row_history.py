#!/usr/bin/env python
"""One call's profiled and replayed times across every committed chain: how steady the ground truth of a row is
from profile to profile, beside how steady its replay is.

A gate on one row (issue 15's "cat rows within 10 % of their profile") assumes the profiled time is a property of
the call. For a call a pass makes once (the rotary embedding's `cat`, 5 calls in a 5-pass profile), it is also a
property of that profile: the state the GPU was in when the forward began. This reads every replayed database
packed under the results tree (`databases*.tar.gz`, as `benchmarks/lib/chain_run.sh` packs them) or given as
a directory, finds the rows of one kernel type with the given Input Shapes (and, optionally, dtypes), and groups
them by device and workload. Databases replayed from one profile (same profiled mean, spread and calls) are one
profile with several replays.

    python benchmarks/probes/row_history.py cat "1,128,64;1,128,64;" --dtypes "DT_FLOAT;DT_FLOAT;" \\
        --json benchmarks/results/row_history/rotary_cat.json

Prints a table per device and workload; exit status 1 when no row matched.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.cuda_replay import _number, quantile, unpacked  # noqa: E402
from opperf import contract  # noqa: E402

CLOCK, POWER = "Profiling Average SM Clock(MHz)", "Profiling Average Power(W)"


def matching_rows(database_root: Path, kernel: str, shapes: str, dtypes: str | None) -> list[dict]:
    """Rows of `<workload>/<policy>/data/<device>/<stack>/<version>/<kernel>.csv` under database_root with these
    Input Shapes (and dtypes), each with its workload, policy and device."""
    found = []
    for path in sorted(database_root.glob(f"**/data/*/*/*/{kernel}.csv")):
        parts = path.parts
        data = len(parts) - 5                           # .../<workload>/<policy>/data/<device>/<stack>/<version>/x.csv
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row.get(contract.INPUT_SHAPES) != shapes or (dtypes and row.get(contract.INPUT_DTYPES) != dtypes):
                    continue
                found.append({"workload": parts[data - 2], "policy": parts[data - 1], "device": parts[data + 1],
                              "profiled_us": _number(row.get(contract.PROFILING_AVERAGE)),
                              "profiled_std_us": _number(row.get("Profiling Std Duration(us)")),
                              "calls": _number(row.get(contract.PROFILING_SAMPLE_COUNT)),
                              "sm_clock_mhz": _number(row.get(CLOCK)), "power_w": _number(row.get(POWER)),
                              "replay_us": _number(row.get(contract.REPLAY_AVERAGE))
                              if row.get(contract.REPLAY_STATUS) == "ok" else None})
    return found


def history(sources: list[Path], kernel: str, shapes: str, dtypes: str | None) -> dict:
    """{device: {workload: {"profiles": [...], summary}}} over every source (a .tar.gz or a directory)."""
    profiles: dict[tuple, dict] = {}
    for source in sources:
        with tempfile.TemporaryDirectory() as scratch:
            root = unpacked(source, Path(scratch))
            for row in matching_rows(root, kernel, shapes, dtypes):
                if row["profiled_us"] is None:
                    continue
                key = (row["device"], row["workload"], row["profiled_us"], row["profiled_std_us"], row["calls"])
                entry = profiles.setdefault(key, {**{k: row[k] for k in ("profiled_us", "profiled_std_us", "calls",
                                                                         "sm_clock_mhz", "power_w")},
                                                  "replays_us": [], "sources": []})
                if row["replay_us"] is not None and row["replay_us"] not in entry["replays_us"]:
                    entry["replays_us"].append(row["replay_us"])      # one replay packed twice counts once
                label = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
                if label not in entry["sources"]:
                    entry["sources"].append(label)
    result: dict = {}
    for (device, workload, *_), entry in sorted(profiles.items(), key=lambda item: item[0][:3]):
        result.setdefault(device, {}).setdefault(workload, {"profiles": []})["profiles"].append(entry)
    for workloads in result.values():
        for summary in workloads.values():
            profiled = [p["profiled_us"] for p in summary["profiles"]]
            replays = [r for p in summary["profiles"] for r in p["replays_us"]]
            summary.update({"profiled_min_us": min(profiled), "profiled_max_us": max(profiled),
                            "profiled_spread": max(profiled) / min(profiled) - 1,
                            "replay_min_us": min(replays, default=None), "replay_max_us": max(replays, default=None),
                            "replay_median_us": quantile(replays, 0.5),
                            "replay_gap_to_each_profile": [abs(1 - quantile(p["replays_us"], 0.5) / p["profiled_us"])
                                                           for p in summary["profiles"] if p["replays_us"]]})
    return result


def table(result: dict) -> str:
    lines = ["| device | workload | profiles | profiled µs (min–max) | profile-to-profile spread | replays | "
             "replay µs (min–max) | replay's gap to its profile (min–max) |", "|---|---|---|---|---|---|---|---|"]
    for device, workloads in result.items():
        for workload, s in workloads.items():
            replays = sum(len(p["replays_us"]) for p in s["profiles"])
            gaps = s["replay_gap_to_each_profile"]
            lines.append(
                f"| {device} | {workload} | {len(s['profiles'])} | {s['profiled_min_us']:.2f}–{s['profiled_max_us']:.2f} "
                f"| {100 * s['profiled_spread']:.1f} % | {replays} | "
                + (f"{s['replay_min_us']:.2f}–{s['replay_max_us']:.2f} | "
                   f"{100 * min(gaps):.1f}–{100 * max(gaps):.1f} % |" if replays else "- | - |"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", help="kernel type (the CSV's name), e.g. cat")
    parser.add_argument("shapes", help="Input Shapes exactly as the CSV has them, e.g. '1,128,64;1,128,64;'")
    parser.add_argument("--dtypes", help="Input Data Types exactly as the CSV has them")
    parser.add_argument("--sources", nargs="*", type=Path,
                        help="replayed databases (.tar.gz or directories; default: every databases*.tar.gz under "
                             "benchmarks/results)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)
    sources = args.sources or sorted((ROOT / "benchmarks" / "results").glob("**/databases*.tar.gz"))
    result = history(sources, args.kernel, args.shapes, args.dtypes)
    if not result:
        print(f"no {args.kernel} row with Input Shapes {args.shapes!r} in {len(sources)} source(s)", file=sys.stderr)
        return 1
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"kernel": args.kernel, "shapes": args.shapes, "dtypes": args.dtypes,
                                         "devices": result}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
