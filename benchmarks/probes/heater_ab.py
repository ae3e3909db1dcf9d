#!/usr/bin/env python
"""after-gemm's heater against none (`cooldown`) on the same short rows, by the power the workload ran them at.

Replay's default power policy, `after-gemm`, runs a bf16 4096^3 GEMM before each call shorter than 0.2 ms, because
inside a model short kernels run between GEMMs (docs/replay.md, "Power state"). The profile's NVML sampler gives each
row the GPU's power around its calls (`Profiling Average Power(W)`). This reads databases replayed under both policies
on one machine (`<run>/<policy>/<workload>/<version_dir>/*.csv`, and `replay.log` beside `<version_dir>` where a replay
was cut off: only kernel types both logs finished are compared) and prints, per run and workload, the rows' profiled
power, the median replay/profiled ratio and the gaps under each policy.

    python benchmarks/probes/heater_ab.py RUN [RUN ...] [--policies after-gemm cooldown] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

PROFILED, REPLAYED, POWER = "Profiling Average Duration(us)", "Average Duration(us)", "Profiling Average Power(W)"


def finished_types(workload_dir: Path) -> set[str] | None:
    """Kernel types the replay log says were written back; None where there is no log (every CSV counts)."""
    log = workload_dir / "replay.log"
    return set(re.findall(r"^(\S+): rows in", log.read_text(), re.M)) if log.is_file() else None


def rows(workload_dir: Path, types: set[str]) -> pd.DataFrame:
    frames = []
    for csv in sorted(workload_dir.glob("*/*.csv")):
        if csv.stem in types:
            frame = pd.read_csv(csv)
            if {PROFILED, REPLAYED} <= set(frame.columns):
                frames.append(frame)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[PROFILED, REPLAYED])
    frame = frame[frame[PROFILED].notna() & frame[REPLAYED].notna()]
    return frame.assign(ratio=frame[REPLAYED] / frame[PROFILED])


def summary(frame: pd.DataFrame) -> dict:
    gap = (frame["ratio"] - 1).abs()
    weights = frame[PROFILED]
    return {"rows": int(len(frame)), "median_ratio": float(frame["ratio"].median()),
            "median_gap": float(gap.median()), "p90_gap": float(np.percentile(gap, 90)),
            "time_weighted_gap": float((gap * weights).sum() / weights.sum())}


def compare(run: Path, policies: tuple[str, str]) -> list[dict]:
    results = []
    for workload in sorted(p.name for p in (run / policies[0]).iterdir() if p.is_dir()):
        dirs = [run / policy / workload for policy in policies]
        if not all(d.is_dir() for d in dirs):
            continue
        every = {csv.stem for d in dirs for csv in d.glob("*/*.csv")}
        logged = [finished_types(d) for d in dirs]
        types = every.intersection(*[every if done is None else done for done in logged])
        frames = [rows(d, types) for d in dirs]
        power = frames[0][POWER] if POWER in frames[0] else pd.Series(dtype=float)
        results.append({"run": run.name, "workload": workload, "kernel_types": sorted(types),
                        "profiled_power_w": [float(q) for q in power.quantile([0, 0.5, 1])] if len(power) else None,
                        **{policy: summary(frame) for policy, frame in zip(policies, frames)}})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--policies", nargs=2, default=["after-gemm", "cooldown"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = []
    for run in args.runs:
        if not (run / args.policies[0]).is_dir():
            print(f"{run}: no {args.policies[0]}/ directory (not a heater A/B run)", file=sys.stderr)
            return 1
        results += compare(run, tuple(args.policies))
    first, second = args.policies
    print(f"| run | workload | rows | profiled power (min / median / max W) | {first}: ratio, median / p90 / "
          f"time-weighted gap | {second}: the same |")
    print("|---|---|---|---|---|---|")
    for r in results:
        power = " / ".join(f"{w:.0f}" for w in r["profiled_power_w"]) if r["profiled_power_w"] else "-"
        cells = [f"{r[p]['median_ratio']:.3f}, {r[p]['median_gap']:.1%} / {r[p]['p90_gap']:.1%} / "
                 f"{r[p]['time_weighted_gap']:.1%}" for p in args.policies]
        print(f"| {r['run']} | {r['workload']} | {r[first]['rows']} | {power} | {cells[0]} | {cells[1]} |")
    if args.json:
        args.json.write_text(json.dumps({"policies": args.policies, "results": results}, indent=1) + "\n")
        print(f"\nwritten to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
