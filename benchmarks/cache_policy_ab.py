#!/usr/bin/env python
"""Two cache policies on the same parsed rows: the table and JSON of one `benchmarks/cache_policy_ab_run.sh` run.

The run leaves, per workload, the databases replayed under each policy (`ab/<workload>/<policy>/data/...`). This
reads them and compares the policies on the rows both replayed (a run cut off by the device tool's time limit leaves
the later policy's last kernel types replayed by the earlier database's policy; those rows are left out, and the
row counts say so): median / p90 / time-weighted gap, the median ratio of the large elementwise rows, and the kernel
types with at least 1 % of the workload's time whose median gap is over 5 % (issue 18's gates but repeatability).

    python benchmarks/cache_policy_ab.py DIR --policies insitu-inplace insitu --device "NVIDIA H200" --date 2026-11-25
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_replay import (WORKLOADS, _pct, analyse_run, gates, large_elementwise, quantile,  # noqa: E402
                         replayed_rows, unpacked, write_summary)

REPLAY_L2_POLICY = "Replay L2 Policy"


def replayed_under(rows: list[dict], policy: str) -> set[tuple[str, int]]:
    """(type, line) of the rows whose `Replay L2 Policy` names this policy."""
    return {(r["_type"], r["_line"]) for r in rows if (r.get(REPLAY_L2_POLICY) or "").split(":")[0] == policy}


def compare(workload: Path, policies: list[str]) -> dict | None:
    runs = {policy: replayed_rows(workload, policy) for policy in policies}
    if not all(runs.values()):
        return None
    common = set.intersection(*(replayed_under(rows, policy) for policy, rows in runs.items()))
    known = WORKLOADS.get(workload.name)
    entry = {"name": workload.name, "unseen": known.unseen if known else None, "rows": len(common), "policies": {}}
    for policy, rows in runs.items():
        chosen = [r for r in rows if (r["_type"], r["_line"]) in common]
        summary = {**analyse_run(chosen), **large_elementwise(chosen)}
        summary.pop("worst_rows")
        over = gates(summary, summary["per_type"])["type_median_gap"]["value"]
        entry["policies"][policy] = {**summary, "types_over": over}
    return entry


def signature_durations(rows: list[dict]) -> dict[tuple, float]:
    """(type, shapes, strides, scalars) -> replayed mean (µs) of one database's rows: rows matched across databases."""
    return {(r["_type"], r.get("Input Shapes", ""), r.get("Input Strides", ""), r.get("Input Scalars", "")):
            float(r["Average Duration(us)"]) for r in rows if r.get("Average Duration(us)")}


def across_machines(results: Path, policy: str, against: list[Path]) -> dict:
    """Per workload, how far this run's replay under `policy` is from the chain's own replay of the same rows (another
    machine of the kind; `against`: those chains' databases_recorded.tar.gz)."""
    out = {}
    with tempfile.TemporaryDirectory() as scratch:
        roots = [unpacked(path, Path(scratch) / str(index)) for index, path in enumerate(against)]
        for workload in sorted((results / "ab").iterdir()):
            mine = replayed_rows(workload, policy)
            theirs = [row for root in roots for directory in sorted(root.glob(f"**/{workload.name}"))
                      for row in replayed_rows(directory, "insitu")]
            if not mine or not theirs:
                continue
            a, b = signature_durations(mine), signature_durations(theirs)
            diffs = [abs(1 - a[k] / b[k]) for k in a if k in b]
            out[workload.name] = {"rows": len(diffs), "median": quantile(diffs, 0.5), "p90": quantile(diffs, 0.9)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="the run's directory (holding ab/<workload>/<policy>/data)")
    parser.add_argument("--policies", nargs=2, default=["insitu-inplace", "insitu"],
                        help="the two policies, as the run named them (runs before 2026-11-25 02:15 UTC called today's insitu "
                        "insitu-copy and today's insitu-inplace insitu)")
    parser.add_argument("--device", required=True)
    parser.add_argument("--date", required=True)
    parser.add_argument("--note", default="", help="what differs about this run (code, cut-offs)")
    parser.add_argument("--output", type=Path, help="JSON path (default: RESULTS/cache_policy_ab.json)")
    parser.add_argument("--against", nargs="+", type=Path, help="the databases_recorded.tar.gz the rows came from: how "
                        "far the first policy's replay is from those chains' (another machine), per workload")
    args = parser.parse_args()
    entries = [e for w in sorted((args.results / "ab").iterdir()) if (e := compare(w, args.policies))]
    first, second = args.policies
    print(f"| workload | rows | {first}: median / p90 / time-weighted, large ratio, types over 5 % | {second} |")
    print("|---|---|---|---|")
    for entry in entries:
        cells = []
        for policy in args.policies:
            m = entry["policies"][policy]
            over = ", ".join(f"{t} {100 * v:.1f} %" for t, v in sorted(m["types_over"].items())) or "none"
            ratio = m["large_elementwise_ratio"]
            cells.append(f"{_pct(m['median_gap'])} / {_pct(m['p90_gap'])} / {_pct(m['time_weighted_gap'])}, "
                         f"{'-' if ratio is None else f'{ratio:.3f}'}, {over}")
        print(f"| {entry['name']} | {entry['rows']} | {' | '.join(cells)} |")
    machines = across_machines(args.results, first, args.against) if args.against else {}
    for name, m in machines.items():
        print(f"{name}: {first} here against the chain's replay on another machine, {m['rows']} rows: median "
              f"{_pct(m['median'])}, p90 {_pct(m['p90'])}")
    document = {"device": args.device, "date": args.date, "policies": args.policies, "note": args.note,
                "across_machines": machines,
                "method": "benchmarks/cache_policy_ab_run.sh: every row replayed under each policy on one machine, "
                          "30 repetitions, after-gemm; rows both policies replayed",
                "workloads": entries}
    return write_summary(args.output or args.results / "cache_policy_ab.json", document, bool(entries))


if __name__ == "__main__":
    raise SystemExit(main())
