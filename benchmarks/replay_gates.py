#!/usr/bin/env python
"""Issue 18's acceptance over committed replay results: one table of every workload on every device, each gate met
or not.

Each RESULT is a `cuda_replay.json` written by `benchmarks/cuda_replay.py`. Its entries carry their gates since
the report computes them (`workloads[].gates`); for an older report, this script computes them from the report
(headline gaps, per-type summary of the default policy) and, given as `REPORT=DATABASES`, from the replayed rows of
that run (the large elementwise rows: a directory, or a `.tar.gz` packed by `benchmarks/lib/chain_run.sh`,
holding `<workload>/insitu/data/<device>/torch/<version>/*.csv` at any depth). A report without a per-workload
repeatability uses its run's (all workloads of that report together), and says so.

    python benchmarks/replay_gates.py A/cuda_replay.json B/cuda_replay.json=B/databases_recorded.tar.gz \\
        --json gates.json

Exit status 0 whatever the verdict (this reports; it does not judge a run), 1 on unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_replay import (DEFAULT_CACHE_POLICY, gates, gates_table, large_elementwise, replayed_rows,  # noqa: E402
                         unpacked, write_summary)


def _database_rows(root: Path, workload: str) -> list[dict]:
    """The replayed rows of one workload under root (its default-policy database, found at any depth)."""
    return [row for directory in sorted(root.glob(f"**/{workload}")) for row in
            replayed_rows(directory, DEFAULT_CACHE_POLICY)]


def evaluate(report: dict, databases: Path | None) -> list[dict]:
    """The report's workload entries with `repeatability_median`, `large_elementwise_*` and `gates` filled in."""
    entries = []
    for entry in report["workloads"]:
        entry = dict(entry)
        name = entry["name"]
        if entry.get("repeatability_median") is None and report.get("repeatability", {}).get("rows"):
            entry["repeatability_median"] = report["repeatability"]["median"]
            entry["repeatability_of"] = "the report's run (all its workloads)"
        if entry.get("large_elementwise_ratio") is None and databases is not None:
            entry.update(large_elementwise(_database_rows(databases, name)))
        entry["gates"] = gates(entry, report["per_workload"][name][DEFAULT_CACHE_POLICY]["per_type"])
        entries.append(entry)
    return entries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="cuda_replay.json files, each optionally =DATABASES (a directory "
                        "or .tar.gz of that run's replayed databases, for reports that predate the gates)")
    parser.add_argument("--json", type=Path, help="write every evaluated entry here")
    args = parser.parse_args()
    document = []
    for argument in args.results:
        path, _, databases = argument.partition("=")
        try:
            report = json.loads(Path(path).read_text(encoding="utf-8"))
            with tempfile.TemporaryDirectory() as scratch:
                entries = evaluate(report, unpacked(Path(databases), Path(scratch)) if databases else None)
        except (OSError, ValueError, KeyError, tarfile.TarError) as error:
            print(f"{argument}: not a cuda_replay.json report with its databases ({error!r})", file=sys.stderr)
            return 1
        document.append({"result": path, "device": report.get("device"),
                         "date": report.get("environment", {}).get("date"), "workloads": entries})
    print("\n".join(gates_table([], device="")))
    for result in document:
        print("\n".join(gates_table(result["workloads"], device=result["device"])[2:]))
    if args.json:
        write_summary(args.json, document, True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
