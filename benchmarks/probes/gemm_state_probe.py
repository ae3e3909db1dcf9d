#!/usr/bin/env python
"""How long a GEMM block before a call reproduces the state the workload ran it in: the dense reference decoder's
64k-token prefill, whose long rows (GEMMs included) replay 4-17 % fast under after-gemm.

The memory-state probe found the state a step: nothing after 25 ms of compute-bound GEMMs, always there after 70 ms
(benchmarks/results/memory_state/, "Where the slowdown sets in"). The parse's `Profiling Average Equivalent GEMM
Before(us)` weighs the history with exp(-age / 25 ms), which gives the prefill's later rows 12-30 ms: under the step.
This replays the selected rows of a replayed database under `--power-policy gemm-history` with that column set to
each of HISTORY_MS in turn (the heater block's length), and prints, per row, the profiled time and the
replay/profiled ratio of the database's own replay and of each heater length.

    # on the GPU host: DB is a replayed database's version directory (e.g. the dense chain's)
    python benchmarks/probes/gemm_state_probe.py run DB --output OUT --history-ms 70 120 [--select REGEX ...]
    python benchmarks/probes/gemm_state_probe.py table DB OUT [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opperf import contract  # noqa: E402

# The 64k-token prefill (64 x 1024 tokens) and the decode steps over its cache, in the reference decoder's shapes.
DEFAULT_SELECT = [r"^65536,", r"^64,1024,", r"^64,64,1024,", r"^64,8,1024,", r"^64,8,8,102[456],", r"^64,8,102[56],"]
LONG_US = 200.0
GEMM_BEFORE = contract.PROFILED_GEMM_BEFORE


def selected(database: Path, patterns: list[str]) -> dict[str, pd.DataFrame]:
    """Per kernel type, the database's long rows whose Input Shapes match one of `patterns`."""
    chosen = {}
    for path in sorted(database.glob("*.csv")):
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        if contract.INPUT_SHAPES not in frame:
            continue
        shapes = frame[contract.INPUT_SHAPES]
        long = pd.to_numeric(frame[contract.PROFILING_AVERAGE], errors="coerce") >= LONG_US
        match = shapes.apply(lambda s: any(re.search(p, s) for p in patterns))
        if (long & match).any():
            chosen[path.stem] = frame[long & match].reset_index(drop=True)
    return chosen


def run(args) -> int:
    chosen = selected(args.database, args.select)
    print(f"{sum(len(f) for f in chosen.values())} rows of {len(chosen)} kernel types: {sorted(chosen)}")
    for history in args.history_ms:
        target = args.output / f"history_{history:g}ms" / args.database.name
        target.mkdir(parents=True, exist_ok=True)
        for kernel, frame in chosen.items():
            frame.assign(**{GEMM_BEFORE: f"{history * 1000:.1f}"}).to_csv(target / f"{kernel}.csv", index=False)
        command = [sys.executable, "scripts/replay.py", "--database-path", str(target), "--backend", "cuda",
                   "--power-policy", "gemm-history", "--repeat-count", str(args.repeat_count)]
        print(f"history {history:g} ms: {' '.join(command)}", flush=True)
        with open(target.parent / "replay.log", "w") as log:
            code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"history {history:g} ms: exit {code}", flush=True)
        if code:
            return code
    return 0


def keyed_ratios(frame: pd.DataFrame, kernel: str, column: str) -> pd.DataFrame:
    """One kernel type's rows by (type, shapes, strides): profiled µs, and replay median / profiled as `column`."""
    profiled = pd.to_numeric(frame[contract.PROFILING_AVERAGE], errors="coerce")
    return pd.DataFrame({"type": kernel, "shapes": frame[contract.INPUT_SHAPES],
                         "strides": frame.get(contract.INPUT_STRIDES, ""), "profiled_us": profiled,
                         column: pd.to_numeric(frame[contract.REPLAY_MEDIAN], errors="coerce") / profiled})


def ratios(database: Path, column: str) -> pd.DataFrame:
    return pd.concat([keyed_ratios(pd.read_csv(path, dtype=str, keep_default_na=False), path.stem, column)
                      for path in sorted(database.glob("*.csv"))], ignore_index=True)


def table(args) -> int:
    chosen = selected(args.database, args.select)
    base = pd.concat(list(chosen.values()), ignore_index=True)
    frame = pd.concat([keyed_ratios(f, k, "database") for k, f in chosen.items()], ignore_index=True)
    frame.insert(3, "gemm_before_ms", pd.to_numeric(base[GEMM_BEFORE], errors="coerce") / 1000)
    frame.insert(5, "calls", pd.to_numeric(base[contract.PROFILING_SAMPLE_COUNT], errors="coerce"))
    columns = ["database"]
    for run_dir in sorted(args.output.glob("history_*ms"), key=lambda p: float(p.name[8:-2])):
        column = run_dir.name
        frame = frame.merge(ratios(run_dir / args.database.name, column)[["type", "shapes", "strides", column]],
                            on=["type", "shapes", "strides"], how="left")
        columns.append(column)
    print("| type | shapes | profiled µs | equivalent GEMM before (ms) | " + " | ".join(columns) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(columns))
    for _, r in frame.sort_values(["type", "profiled_us"]).iterrows():
        print(f"| {r['type']} | {r['shapes'][:40]} | {r['profiled_us']:.1f} | {r['gemm_before_ms']:.1f} | "
              + " | ".join(f"{r[c]:.3f}" for c in columns) + " |")
    weight = frame["profiled_us"] * frame["calls"]
    summary = {c: {"median_ratio": float(frame[c].median()),
                   "time_weighted_gap": float(((frame[c] - 1).abs() * weight).sum() / weight[frame[c].notna()].sum())}
               for c in columns}
    print("\n| replay | median ratio | time-weighted gap |\n|---|---:|---:|")
    for c, s in summary.items():
        print(f"| {c} | {s['median_ratio']:.3f} | {s['time_weighted_gap']:.1%} |")
    if args.json:
        args.json.write_text(json.dumps({"rows": frame.to_dict(orient="records"), "summary": summary}, indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("run", "table"):
        p = sub.add_parser(name)
        p.add_argument("database", type=Path, help="a replayed database's version directory")
        if name == "table":
            p.add_argument("output", type=Path)
            p.add_argument("--json", type=Path)
        else:
            p.add_argument("--output", type=Path, required=True)
            p.add_argument("--history-ms", type=float, nargs="+", default=[70.0, 120.0])
            p.add_argument("--repeat-count", type=int, default=15)
        p.add_argument("--select", nargs="+", default=DEFAULT_SELECT, help="Input Shapes regexes of the rows")
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else table(args)


if __name__ == "__main__":
    raise SystemExit(main())
