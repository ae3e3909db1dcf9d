#!/usr/bin/env python
"""Reproduce (WIP, UNVERIFIED): the CUDA replay-accuracy benchmark on an NVIDIA GPU host.

Status
    Not yet run as a whole: written on a host without a GPU. It calls `benchmarks/cuda_replay.py --work-dir
    DIR --output DIR/results` (further arguments passed through after `--`); that benchmark itself ran on an
    H100 on 2026-11-23 (benchmarks/results/cuda_replay/). Move this script to reproduce/ once it has run on an
    H100/H200 and its numbers are checked against benchmarks/results/cuda_replay/.

Goal
    Profile the bf16 reference decoder on the GPU, parse it, replay every row with the CUDA timer, and say
    per kernel type how far replay is from the profiled in-workload time (median replay/profile ratio,
    p10/p90, rows inside the band), as in the replay report.

Prerequisites
    An NVIDIA GPU (validated type: H100/H200), its CUDA driver, Python >= 3.11 and the project with the
    host's CUDA build of torch: python3 -m venv .venv && . .venv/bin/activate && pip install torch -e '.[test]'

How to run
    python reproduce/wip/reproduce_cuda_replay_accuracy.py --device 0 --output cuda_replay_accuracy.json
    python reproduce/wip/reproduce_cuda_replay_accuracy.py --device 0 -- --repeat-count 100   # passed through

What to expect
    One line per kernel type (rows, paired rows, median replay/profile, rows inside 0.8-1.2) and a JSON
    report in the schema of reports/.../summary.json (benchmark, script, workflow, pass_n, ops_count,
    elapsed_s, device_ids, max_concurrency, llm_concurrency, env_spec, task_log_dir, stats.op_results with
    profile gen_time/base_time/speedup), plus replay_report.md and plots in --workdir/report/.
    Exit 0 when every kernel type replayed every row, 1 otherwise, 2 on bad arguments or no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARK = REPO / "benchmarks" / "cuda_replay.py"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", type=int, default=0, help="CUDA device id (default: %(default)s)")
    parser.add_argument("--output", default="cuda_replay_accuracy.json", help="JSON report (default: %(default)s)")
    parser.add_argument("--workdir", default=None, help="benchmark output directory (default: a new /tmp dir)")
    parser.add_argument("--band", type=float, nargs=2, default=[0.8, 1.2], metavar=("LOW", "HIGH"))
    parser.add_argument("benchmark_args", nargs="*", help="after --: passed to benchmarks/cuda_replay.py")
    return parser


def main() -> int:
    args = build_parser().parse_args()
    sys.path.insert(0, str(REPO))
    import torch

    from opperf.io import write_text_atomic
    from opperf.report.build import reproduce_fields, write_report

    if not torch.cuda.is_available():
        print("no CUDA device visible: run this on an NVIDIA GPU host")
        return 2
    if not BENCHMARK.is_file():
        print(f"{BENCHMARK} is missing (it is being written; see this script's Status)")
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="opperf-cuda-replay."))
    command = [sys.executable, str(BENCHMARK), "--work-dir", str(workdir), "--output", str(workdir / "results"),
               *args.benchmark_args]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(args.device)}
    print(f"[reproduce] {' '.join(command)}", flush=True)
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, env=env)
    elapsed_s = time.monotonic() - started
    if result.returncode != 0:
        print(f"[reproduce] benchmarks/cuda_replay.py failed (exit {result.returncode})")
        return 1
    # The default cache policy's replayed databases (the benchmark also keeps the other policies' copies).
    csvs = sorted(p for p in workdir.glob("*/insitu/data/*/torch/*/*.csv")
                  if "Average Duration(us)" in p.read_text().split("\n", 1)[0])
    if not csvs:
        print(f"[reproduce] no replayed per-kernel CSV under {workdir}")
        return 1
    write_report(csvs, workdir / "report", title=f"cuda replay accuracy ({torch.cuda.get_device_name(0)})",
                 backend="cuda", band=tuple(args.band), task_log_dir=str(workdir))
    summary = reproduce_fields(
        json.loads((workdir / "report" / "summary.json").read_text()),
        script="reproduce/wip/reproduce_cuda_replay_accuracy.py",
        workflow="benchmarks/cuda_replay.py: workload -> parse -> replay (CUDA) -> report", elapsed_s=elapsed_s,
        device_ids=[args.device], max_concurrency=1, task_log_dir=str(workdir))
    summary["benchmark"] = "opperf_cuda_replay_accuracy"
    headline = json.loads((workdir / "results" / "cuda_replay.json").read_text())
    summary["cuda_replay"] = {k: headline[k] for k in ("median_gap", "p90_gap", "time_weighted_gap",
                                                        "repeatability_median", "rows_per_s")}
    write_text_atomic(args.output, json.dumps(summary, indent=2) + "\n")
    for kernel_type, a in sorted(summary["replay_accuracy"]["kernel_types"].items()):
        print(f"{kernel_type:<46}paired {a['paired_rows']:>4}  median replay/profile "
              f"{a['median_ratio'] if a['median_ratio'] is not None else '-'}  inside {a['inside_band']}")
    stats = summary["stats"]
    print(f"[reproduce] {stats['total_ops']} kernel types, pass rate {stats['pass_rate']} -> {args.output}")
    return 0 if stats["pass_rate"] == 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
