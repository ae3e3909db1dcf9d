#!/usr/bin/env python
"""Reproduce: build opperf's CPU operator-performance database end to end and report its replay accuracy.

Goal
    Show on any machine, with nothing but the project's own install, the whole pipeline of README's command
    1: the reference decoder profiled on the CPU, parsed into one CSV per kernel type, widened by the shape
    grid, every row replayed, the database written (data/CPU/torch/<torch>_cpu/), gloo collectives
    benchmarked, and the replay report. Then summarise, per kernel type, how far replay is from profile.

Prerequisites
    Linux (or macOS), Python >= 3.11, 2+ CPU cores, ~2 GB free memory, ~200 MB disk. No GPU/NPU, no network.
    Install once, from the repository root:
        python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e '.[test]'

How to run
    python reproduce/reproduce_cpu_database_end_to_end.py                       # 2 cores, fresh /tmp copy
    python reproduce/reproduce_cpu_database_end_to_end.py --concurrency 4 --output cpu_database.json
    python reproduce/reproduce_cpu_database_end_to_end.py --profile profiles/slurm   # the same, on SLURM

    The workflow (Snakefile, rules, scripts, opperf, config, ...) is copied into --workdir and run there with
    `python -m snakemake --cores N` (plus --profile if given), so the checkout is never written to.

What to expect
    83 s on a quiet 2-core CI machine (2026-11-23); 588 s on the same machine type at load average 9-11
    (2026-11-24; the latest: benchmarks/results/cpu_end_to_end/). The script prints one line per kernel type (rows,
    paired profiled rows, median replay/profile, rows inside the 0.8-1.2 band) and writes a JSON report in
    the schema of reports/.../summary.json with the reproduce-scripts conventions' fields (benchmark, script,
    workflow, pass_n, ops_count, elapsed_s: this script's wall time, device_ids, max_concurrency,
    llm_concurrency, env_spec, task_log_dir, stats.op_results with profile gen_time/base_time/speedup;
    opperf.report.build.reproduce_fields), plus when, on which CPU and under what load it ran ("measured"). On torch 2.13.0:
    14 kernel types, 262 rows, pass_rate 1.0. Most CPU rows are outside the 0.8-1.2 band (replay and
    profile spread both ways): docs/replay.md, "CPU back end: accuracy", says why. Exit code 0 when every kernel type replayed every row and every database
    CSV has a replay duration in every row; 1 otherwise; 2 on bad arguments.

Data / configuration
    config/config.yaml (unchanged), config/models.yaml (opperf-tiny), config/grid.yaml, config/kernels/torch/,
    resources/profiles/ (the A3 example, parsed only). Outputs under --workdir: data/, reports/, traces/, logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORKFLOW_PARTS = ("Snakefile", "rules", "scripts", "opperf", "config", "templates", "resources", "envs", "report",
                  "profiles")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=2, help="Snakemake --cores (default: %(default)s)")
    parser.add_argument("--output", default="cpu_database_end_to_end.json",
                        help="JSON report to write (default: %(default)s)")
    parser.add_argument("--workdir", default=None, help="where to copy and run the workflow (default: a new /tmp dir)")
    parser.add_argument("--profile", default=None, help="Snakemake profile to run through, e.g. profiles/slurm")
    parser.add_argument("--device", default="cpu", choices=["cpu"], help="back end (this script: cpu only)")
    return parser


def copy_workflow(destination: Path) -> None:
    destination.mkdir(parents=True, exist_ok=True)
    for part in WORKFLOW_PARTS:
        source = REPO / part
        if source.is_dir():
            shutil.copytree(source, destination / part, ignore=shutil.ignore_patterns("__pycache__"),
                            dirs_exist_ok=True)
        elif source.exists():
            shutil.copy2(source, destination / part)


def main() -> int:
    args = build_parser().parse_args()
    sys.path.insert(0, str(REPO))
    from opperf.contract import REPLAY_AVERAGE
    from opperf.io import read_database_csv, write_text_atomic
    from opperf.report.build import reproduce_fields
    from opperf.versions import cpu_version_dir

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="opperf-cpu-database."))
    copy_workflow(workdir)
    command = [sys.executable, "-m", "snakemake", "--cores", str(args.concurrency)]
    if args.profile:
        command += ["--profile", args.profile]
    print(f"[reproduce] {' '.join(command)}  (in {workdir})", flush=True)
    started = time.monotonic()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    load_before = [round(x, 2) for x in os.getloadavg()]     # other work on the host slows every stage
    with open(workdir / "reproduce_snakemake.log", "w", encoding="utf-8") as log:
        result = subprocess.run(command, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    elapsed_s = time.monotonic() - started
    load_after = [round(x, 2) for x in os.getloadavg()]
    if result.returncode != 0:
        print(f"[reproduce] snakemake failed (exit {result.returncode}); see {workdir / 'reproduce_snakemake.log'}")
        return 1

    root = Path("CPU") / "torch" / cpu_version_dir()
    summary = json.loads((workdir / "reports" / root / "summary.json").read_text(encoding="utf-8"))
    database_csvs = sorted((workdir / "data" / root).glob("*.csv"))
    unreplayed = {p.stem: int((read_database_csv(p)[REPLAY_AVERAGE] == "").sum()) for p in database_csvs}
    unreplayed = {k: v for k, v in unreplayed.items() if v}
    accuracy = summary.get("replay_accuracy", {}).get("kernel_types", {})
    print(f"{'kernel type':<46}{'rows':>6}{'paired':>8}{'median r/p':>12}{'inside band':>13}")
    for kernel_type, entry in sorted(summary["stats"]["op_results"].items()):
        a = accuracy.get(kernel_type, {})
        median = a.get("median_ratio")
        print(f"{kernel_type:<46}{entry['total']:>6}{a.get('paired_rows', 0):>8}"
              f"{'-' if median is None else f'{median:.3f}':>12}{a.get('inside_band', 0):>13}")

    report = {**reproduce_fields(summary, script="reproduce/reproduce_cpu_database_end_to_end.py",
                                 workflow="opperf snakemake: workload -> parse -> grid -> replay -> database -> comm "
                                          "-> report",
                                 elapsed_s=elapsed_s, device_ids=[], max_concurrency=args.concurrency,
                                 task_log_dir=str(workdir / "logs")),
              "benchmark": "opperf_cpu_database_end_to_end",
              "database_dir": str(workdir / "data" / root), "database_csvs": len(database_csvs),
              "rows_without_replay": unreplayed, "snakemake_profile": args.profile or "",
              "rows": sum(entry["total"] for entry in summary["stats"]["op_results"].values()),
              "measured": {"started_at": started_at, "cpu_model": summary["env_spec"].get("cpu_model", ""),
                           "load_average_1_5_15_min_before": load_before,
                           "load_average_1_5_15_min_after": load_after}}
    write_text_atomic(args.output, json.dumps(report, indent=2) + "\n")
    stats = summary["stats"]
    ok = stats["pass_rate"] == 1.0 and not unreplayed and len(database_csvs) == stats["total_ops"]
    print(f"[reproduce] {stats['total_ops']} kernel types, pass rate {stats['pass_rate']}, "
          f"{len(database_csvs)} database CSVs, {elapsed_s:.0f} s -> {args.output}: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
