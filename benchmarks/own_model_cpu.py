#!/usr/bin/env python
"""docs/grid.md's "A database for your own model" on the cpu back end, run verbatim: the page's cpu config through
the workflow twice, and its by-hand cpu commands once, each in a fresh clone of the repository (HEAD), so the page's
row counts, kernel types, status shares and times are what a user gets, and the two routes' predictions can be set
against the spread of two workflow runs.

    python benchmarks/own_model_cpu.py [--runs 2] [--output benchmarks/results/own_model_cpu]

The config and the commands are read from docs/grid.md (the fenced blocks whose first line is
`# my_model_cpu.yaml` and `# by hand, cpu`), not copied here; the setup block before them (`# setup, cpu`) makes
`my_model/config.json` and the empty sources sheet. Writes own_model_cpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from opperf.contract import REPLAY_STATUS
from opperf.io import write_text_atomic

FENCE = re.compile(r"```(?:yaml|bash)\n(# (?P<name>[^\n]+)\n.*?)```", re.DOTALL)
DATABASE = "data/CPU/torch/torch{torch}_cpu_hf_my_model"


def page_blocks() -> dict[str, str]:
    """docs/grid.md's fenced blocks by their first comment line's first words."""
    blocks = {}
    for found in FENCE.finditer((REPO / "docs" / "grid.md").read_text()):
        blocks[found["name"].split(":")[0].strip()] = found.group(1)
    return blocks


def fresh_clone(where: Path, setup: str) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(where)], check=True)
    subprocess.run(["bash", "-euo", "pipefail", "-c", setup], cwd=where, check=True)
    return where


def database_summary(directory: Path) -> dict:
    """Kernel types, rows and the rows' replay statuses (share of all rows) of a built database."""
    frames = [pd.read_csv(p, dtype=str, keep_default_na=False) for p in sorted(directory.glob("*.csv"))]
    rows = pd.concat(frames, ignore_index=True)
    statuses = rows[REPLAY_STATUS].replace("", "(none)").value_counts()
    return {"kernel_types": len(frames), "rows": len(rows),
            "status_shares": {status: round(count / len(rows), 4) for status, count in statuses.items()}}


def predictions(path: Path) -> dict:
    document = json.loads(path.read_text())
    return {s["name"]: {"predicted_us": s["predicted_us"], "status_time_share": s["status_time_share"]}
            for s in document["scenarios"]}


def run_workflow(clone: Path) -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "my_model_cpu.yaml"],
                          cwd=clone, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"workflow failed in {clone}:\n{done.stderr[-3000:]}")
    torch_version = _torch_version()
    database = clone / DATABASE.format(torch=torch_version)
    report = clone / "reports" / "CPU" / "torch" / database.name
    summary = json.loads((report / "summary.json").read_text())
    return {"seconds": round(seconds, 1), **database_summary(database),
            "replay_pass_rate": summary["stats"]["pass_rate"], "predictions": predictions(report / "predictions.json")}


def run_by_hand(clone: Path, commands: str) -> dict:
    started = time.monotonic()
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", commands], cwd=clone, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"by-hand commands failed in {clone}:\n{done.stderr[-3000:]}")
    database = clone / (DATABASE.format(torch=_torch_version()) + "_by_hand")
    return {"seconds": round(seconds, 1), **database_summary(database),
            "predictions": predictions(clone / "prediction.json")}


def _torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2, help="workflow runs (the spread is between them)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/own_model_cpu"))
    parser.add_argument("--output", type=Path, default=REPO / "benchmarks" / "results" / "own_model_cpu")
    args = parser.parse_args()
    blocks = page_blocks()
    setup = blocks["setup, cpu"]
    config = blocks["my_model_cpu.yaml"]
    setup_with_config = f"{setup}\ncat > my_model_cpu.yaml <<'EOF'\n{config}EOF\n"
    workflow_runs = []
    for run in range(args.runs):
        clone = fresh_clone(args.work_dir / f"workflow_{run}_{int(time.time())}", setup_with_config)
        workflow_runs.append(run_workflow(clone))
        print(f"workflow run {run + 1}: {workflow_runs[-1]['seconds']} s", flush=True)
    clone = fresh_clone(args.work_dir / f"by_hand_{int(time.time())}", setup)
    by_hand = run_by_hand(clone, blocks["by hand, cpu"])
    print(f"by hand: {by_hand['seconds']} s", flush=True)

    table = ["| scenario | " + " | ".join(f"workflow {i + 1}" for i in range(len(workflow_runs)))
             + " | spread | by hand | by hand / workflow mean |", "|---" * (len(workflow_runs) + 4) + "|"]
    comparison = {}
    for scenario in by_hand["predictions"]:
        values = [w["predictions"][scenario]["predicted_us"] for w in workflow_runs]
        mean = sum(values) / len(values)
        spread = (max(values) - min(values)) / mean
        ratio = by_hand["predictions"][scenario]["predicted_us"] / mean
        comparison[scenario] = {"workflow_us": values, "spread": spread, "by_hand_us":
                                by_hand["predictions"][scenario]["predicted_us"], "by_hand_over_mean": ratio,
                                "inside_spread": min(values) <= by_hand["predictions"][scenario]["predicted_us"]
                                <= max(values)}
        table.append(f"| {scenario} | " + " | ".join(f"{v:,.1f}" for v in values)
                     + f" | {spread:.1%} | {by_hand['predictions'][scenario]['predicted_us']:,.1f} | {ratio:.3f} |")
    print("\n".join(table))
    document = {"date": dt.date.today().isoformat(), "machine": f"{platform.node()} {platform.machine()}, "
                f"{subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores",
                "python": platform.python_version(), "torch": _torch_version(),
                "workflow_runs": workflow_runs, "by_hand": by_hand, "comparison": comparison}
    args.output.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.output / "own_model_cpu.json", json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
