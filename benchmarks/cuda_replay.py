#!/usr/bin/env python
"""Replay accuracy, repeatability and throughput on a CUDA GPU, through the workflow's own stages.

For each workload (a dense and a MoE model of config/models.yaml, a few layers, prefill and decode
over a KV cache), on this host's GPU:

  1. profile    scripts/profile_workload.py --backend cuda (torch.profiler, CUPTI kernel times)
  2. parse      scripts/parse_kernel_details.py → data/{device}/torch/{version_dir}/{Type}.csv
  3. replay     scripts/replay.py --database-path (a copy of the parsed database per cache policy,
                plus a second, independent replay under the default policy for repeatability)
  4. fixed cost scripts/replay.py --rows on a one-row CSV, three times (a warm machine's per-job cost)

and writes `cuda_replay.json` and `cuda_replay.md` in --output: per policy the median / p90 /
time-weighted gap between each profiled row's replay and its in-workload time (overall and per
kernel type), repeatability, rows/s at the repeat count and the share of replay time spent inside
measured kernels, the worst rows with their shapes, and device, driver, CUDA, torch and date.

Gap of a row: |1 - replay / profiled|, replay = `Average Duration(us)` (mean of the timed calls),
profiled = `Profiling Average Duration(us)` (mean over the workload's calls of that signature).
Time-weighted gap: sum |replay - profiled| x calls / sum profiled x calls (calls = Profiling Sample Count).

Stages can run separately (`--stages profile parse` on one call, `--stages replay report` on a later
one with the same --work-dir), so the whole benchmark fits machines held for a few minutes at a time.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opperf import contract  # noqa: E402
from opperf.replay.methods import CACHE_POLICIES, DEFAULT_CACHE_POLICY  # noqa: E402

WORKLOADS = {
    # name: (model, layers, prefill lengths, decode batch sizes, decode context, decode steps)
    "dense": ("Qwen3-32B", 2, (128, 512, 2048, 4096), (1, 8, 64), 1024, 2),
    # Routing gives each expert its own token count, so every forward adds ~100 distinct expert GEMM shapes:
    # fewer forwards keep the MoE database near 1,000 rows.
    "moe": ("Qwen3-235B-A22B", 2, (128, 1024, 4096), (1, 16, 64), 256, 2),
}
STAGES = ("profile", "parse", "replay", "fixed", "report")
ENVIRONMENT_FILE = "environment.json"     # written on the GPU host, so the report can be made anywhere
REPEAT_RUN = f"{DEFAULT_CACHE_POLICY}-repeat"


def run(command: list[str], log_path: Path) -> float:
    """Run one stage's script; its output goes to log_path; returns wall seconds (raises on failure)."""
    began = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
    elapsed = time.perf_counter() - began
    if completed.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} failed ({completed.returncode}):\n{tail}")
    return elapsed


def environment() -> dict:
    import torch

    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    properties = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "nvidia_smi": smi.stdout.strip(), "version_dir": version_dir(),
            "l2_cache_bytes": int(properties.L2_cache_size), "sm_count": properties.multi_processor_count,
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def version_dir() -> str:
    from opperf.versions import workload_version_dir

    return workload_version_dir("cuda")


def database_dir(work: Path, workload: str, run_name: str, args) -> Path:
    return work / workload / run_name / "data" / args.device / "torch" / args.version_dir


def stage_profile(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        model, layers, prefills, decode_batches, context, steps = WORKLOADS[name]
        out = work / name / "profile"
        (work / name).mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "scripts/profile_workload.py", "--backend", "cuda", "--dtype", "bfloat16",
                   "--model", model, "--num-layers", str(layers), "--prefill-lengths", *map(str, prefills),
                   "--decode-batch-sizes", *map(str, decode_batches), "--decode-context", str(context),
                   "--decode-steps", str(steps), "--output", str(out)]
        timings[name] = run(command, work / name / "profile.log")
    return timings


def stage_parse(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        target = database_dir(work, name, "parsed", args)
        command = [sys.executable, "scripts/parse_kernel_details.py", "--profiling-path",
                   str(work / name / "profile" / "trace.json"), "--database-path", str(target)]
        timings[name] = run(command, work / name / "parse.log")
    return timings


def stage_replay(work: Path, args) -> dict:
    timings = {}
    for name in args.workloads:
        parsed = database_dir(work, name, "parsed", args)
        for run_name in [*args.policies, REPEAT_RUN]:
            policy = run_name.removesuffix("-repeat")
            target = database_dir(work, name, run_name, args)
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(parsed, target)
            command = [sys.executable, "scripts/replay.py", "--database-path", str(target), "--backend", "cuda",
                       "--device", args.device, "--repeat-count", str(args.repeat_count), "--l2-policy", policy,
                       "--seed", str(1 if run_name == REPEAT_RUN else 0),
                       "--reports-dir", str(work / name / run_name / "reports")]
            timings[f"{name}/{run_name}"] = run(command, work / name / f"replay_{run_name}.log")
    return timings


def stage_fixed(work: Path, args) -> dict:
    """A one-row job's wall time minus its row's own replay time, three times (the per-job fixed cost)."""
    name = args.workloads[0]
    parsed = database_dir(work, name, "parsed", args)
    source = parsed / "mul.csv" if (parsed / "mul.csv").exists() else sorted(parsed.glob("*.csv"))[0]
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        first = next(reader)
        fields = reader.fieldnames
    one_row = work / "fixed" / source.name
    one_row.parent.mkdir(parents=True, exist_ok=True)
    with open(one_row, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow(first)
    walls = []
    for attempt in range(3):
        output = work / "fixed" / f"out_{attempt}.csv"
        command = [sys.executable, "scripts/replay.py", "--rows", str(one_row), "--kernel", source.stem,
                   "--definitions", "config/kernels", "--backend", "cuda", "--version-dir", args.version_dir,
                   "--output", str(output), "--repeat-count", str(args.repeat_count)]
        wall = run(command, work / "fixed" / f"replay_{attempt}.log")
        with open(output, newline="", encoding="utf-8") as handle:
            row = next(csv.DictReader(handle))
        kernel_s = float(row[contract.REPLAY_AVERAGE] or 0) * (args.repeat_count + 3) / 1e6
        walls.append({"wall_s": round(wall, 3), "row_kernel_s": round(kernel_s, 6),
                      "log": _child_stats(work / "fixed" / f"replay_{attempt}.log")})
    return {"kernel_type": source.stem, "runs": walls,
            "fixed_cost_s_median": round(statistics.median(w["wall_s"] - w["row_kernel_s"] for w in walls), 3)}


_STATS_RE = re.compile(r"imports ([\d.]+) s, setup ([\d.]+) s, (\d+) rows in ([\d.]+) s "
                       r"\(of which collecting samples ([\d.]+) s\)")


def _child_stats(log_path: Path) -> list[dict]:
    text = log_path.read_text(encoding="utf-8", errors="replace")
    return [{"import_s": float(m[0]), "setup_s": float(m[1]), "rows": int(m[2]), "rows_s": float(m[3]),
             "collect_s": float(m[4])} for m in _STATS_RE.findall(text)]


def _number(value: str | None) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def read_rows(database: Path) -> list[dict]:
    rows = []
    for path in sorted(database.glob("*.csv")):
        with open(path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                row["_type"], row["_line"] = path.stem, line
                rows.append(row)
    return rows


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def gap_summary(pairs: list[tuple[float, float, int]]) -> dict:
    """pairs: (replay µs, profiled µs, profiled calls)."""
    gaps = [abs(1 - r / p) for r, p, _ in pairs]
    weighted = (sum(abs(r - p) * n for r, p, n in pairs) / sum(p * n for _, p, n in pairs)) if pairs else None
    return {"rows": len(pairs), "median_gap": quantile(gaps, 0.5), "p90_gap": quantile(gaps, 0.9),
            "time_weighted_gap": weighted,
            "median_ratio": quantile([r / p for r, p, _ in pairs], 0.5),
            "profiled_time_share": sum(p * n for _, p, n in pairs)}


def analyse_run(rows: list[dict]) -> dict:
    pairs, per_type, statuses, worst = [], {}, {}, []
    for row in rows:
        statuses[row.get(contract.REPLAY_STATUS, "")] = statuses.get(row.get(contract.REPLAY_STATUS, ""), 0) + 1
        replay, profiled = _number(row.get(contract.REPLAY_AVERAGE)), _number(row.get(contract.PROFILING_AVERAGE))
        if replay is None or profiled is None:
            continue
        calls = int(float(row.get(contract.PROFILING_SAMPLE_COUNT) or 1))
        pairs.append((replay, profiled, calls))
        per_type.setdefault(row["_type"], []).append((replay, profiled, calls))
        worst.append({"type": row["_type"], "line": row["_line"], "replay_us": replay, "profiled_us": profiled,
                      "ratio": replay / profiled, "calls": calls, "shapes": row.get(contract.INPUT_SHAPES, ""),
                      "strides": row.get(contract.INPUT_STRIDES, ""), "dtypes": row.get(contract.INPUT_DTYPES, ""),
                      "cache": row.get(contract.REPLAY_L2_POLICY, "")})
    total_time = sum(p * n for _, p, n in pairs) or 1.0
    summary = gap_summary(pairs)
    types = {}
    for name, type_pairs in sorted(per_type.items()):
        types[name] = gap_summary(type_pairs)
        types[name]["profiled_time_share"] /= total_time
    summary["profiled_time_share"] = 1.0
    worst.sort(key=lambda w: -abs(1 - w["ratio"]) * w["profiled_us"] * w["calls"])
    return {**summary, "statuses": statuses, "per_type": types, "worst_rows": worst[:25]}


def in_power_limited_phase(row: dict) -> bool:
    """A dense row of the decode-batch-64 context prefill (64 x 1024 = 65,536 tokens): the longest, GEMM-bound
    phase of the run, where the GPU sits at its power limit and every kernel runs at a lower clock than
    replay's (see cuda_power_probe.json). Reported apart so that its bias is visible, never dropped."""
    shapes = row.get(contract.INPUT_SHAPES, "")
    return row.get("_workload") == "dense" and shapes.startswith(("65536,", "64,1024,", "64,64,1024,", "64,8,8,1024,"))


def repeatability(first: list[dict], second: list[dict]) -> dict:
    def key(row):
        return row["_type"], row["_line"]
    other = {key(r): _number(r.get(contract.REPLAY_AVERAGE)) for r in second}
    diffs = []
    for row in first:
        a, b = _number(row.get(contract.REPLAY_AVERAGE)), other.get(key(row))
        if a is not None and b is not None:
            diffs.append(abs(1 - b / a))
    return {"rows": len(diffs), "median": quantile(diffs, 0.5), "p90": quantile(diffs, 0.9)}


def stage_report(work: Path, args, env: dict, wall: dict, fixed: dict | None) -> dict:
    report = {"environment": env, "repeat_count": args.repeat_count, "default_policy": DEFAULT_CACHE_POLICY,
              "workloads": {n: dict(zip(("model", "layers", "prefill_lengths", "decode_batch_sizes",
                                         "decode_context", "decode_steps"), WORKLOADS[n])) for n in args.workloads},
              "policies": {}, "per_workload": {}, "fixed_cost": fixed, "stage_wall_s": wall}
    for run_name in [*args.policies, REPEAT_RUN]:
        merged = []
        for name in args.workloads:
            rows = read_rows(database_dir(work, name, run_name, args))
            for row in rows:
                row["_workload"] = name
            report["per_workload"].setdefault(name, {})[run_name] = analyse_run(rows)
            merged += [{**r, "_line": f"{name}:{r['_line']}"} for r in rows]
        report["policies"][run_name] = analyse_run(merged)
    default = report["policies"][DEFAULT_CACHE_POLICY]
    merged = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, DEFAULT_CACHE_POLICY, args)),
                                                         n)]
    report["phases"] = {
        "power_limited_prefill": _headline(analyse_run([r for r in merged if in_power_limited_phase(r)])),
        "all_other_rows": _headline(analyse_run([r for r in merged if not in_power_limited_phase(r)]))}
    first = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, DEFAULT_CACHE_POLICY, args)), n)]
    second = [r for n in args.workloads for r in _tagged(read_rows(database_dir(work, n, REPEAT_RUN, args)), n)]
    report["repeatability"] = repeatability(first, second)
    replay_wall = sum(wall.get("replay", {}).get(f"{n}/{DEFAULT_CACHE_POLICY}", 0) for n in args.workloads)
    replayed = sum(1 for r in first if _number(r.get(contract.REPLAY_AVERAGE)) is not None)
    kernel_s = sum(_number(r.get(contract.REPLAY_AVERAGE)) * args.repeat_count / 1e6 for r in first
                   if _number(r.get(contract.REPLAY_AVERAGE)) is not None)
    report.update({"median_gap": default["median_gap"], "p90_gap": default["p90_gap"],
                   "time_weighted_gap": default["time_weighted_gap"],
                   "repeatability_median": report["repeatability"]["median"],
                   "rows_per_s": replayed / replay_wall if replay_wall else None,
                   "replayed_rows": replayed, "replay_wall_s": replay_wall,
                   "kernel_time_share": kernel_s / replay_wall if replay_wall else None})
    return report


def _tagged(rows: list[dict], name: str) -> list[dict]:
    return [{**r, "_line": f"{name}:{r['_line']}", "_workload": name} for r in rows]


def _headline(summary: dict) -> dict:
    return {k: summary[k] for k in ("rows", "median_gap", "p90_gap", "time_weighted_gap", "median_ratio")}


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [f"# CUDA replay accuracy ({env['device']}, {env['date'][:10]})", "",
             f"{env['nvidia_smi']}; torch {env['torch']}, CUDA {env['cuda']}, Python {env['python']}; "
             f"L2 {env['l2_cache_bytes'] // 1024} KiB. Repeat count {report['repeat_count']}. "
             f"Produced by `python benchmarks/cuda_replay.py` (see its docstring for the definitions).", "",
             "| workload | model | layers | prefill | decode batches (context, steps) |", "|---|---|---|---|---|"]
    for name, w in report["workloads"].items():
        lines.append(f"| {name} | {w['model']} | {w['layers']} | {', '.join(map(str, w['prefill_lengths']))} | "
                     f"{', '.join(map(str, w['decode_batch_sizes']))} ({w['decode_context']}, {w['decode_steps']}) |")
    lines += ["", "## Gap to the in-workload time, per cache policy (profiled rows of both workloads)", "",
              "| policy | rows | median gap | p90 gap | time-weighted gap | median replay/profiled |",
              "|---|---|---|---|---|---|"]
    for run_name, summary in report["policies"].items():
        lines.append(f"| {run_name} | {summary['rows']} | {_pct(summary['median_gap'])} | {_pct(summary['p90_gap'])} | "
                     f"{_pct(summary['time_weighted_gap'])} | {_ratio(summary['median_ratio'])} |")
    default = report["policies"][report["default_policy"]]
    lines += ["", f"## Per kernel type ({report['default_policy']})", "",
              "| type | rows | share of workload time | median gap | p90 gap | time-weighted gap | median ratio |",
              "|---|---|---|---|---|---|---|"]
    for name, t in sorted(default["per_type"].items(), key=lambda kv: -kv[1]["profiled_time_share"]):
        lines.append(f"| {name} | {t['rows']} | {_pct(t['profiled_time_share'])} | {_pct(t['median_gap'])} | "
                     f"{_pct(t['p90_gap'])} | {_pct(t['time_weighted_gap'])} | {_ratio(t['median_ratio'])} |")
    lines += ["", "## Worst rows (by |replay - profiled| x calls)", "",
              "| row | replay µs | profiled µs | ratio | calls | input shapes | strides |", "|---|---|---|---|---|---|---|"]
    for w in default["worst_rows"][:15]:
        lines.append(f"| {w['type']} {w['line']} | {w['replay_us']:.2f} | {w['profiled_us']:.2f} | {w['ratio']:.2f} | "
                     f"{w['calls']} | `{w['shapes']}` | `{w['strides']}` |")
    lines += ["", f"## Where the remaining gap is ({report['default_policy']})", "",
              "| rows | count | median gap | p90 gap | time-weighted gap | median ratio |", "|---|---|---|---|---|---|"]
    for name, phase in report.get("phases", {}).items():
        lines.append(f"| {name.replace('_', ' ')} | {phase['rows']} | {_pct(phase['median_gap'])} | "
                     f"{_pct(phase['p90_gap'])} | {_pct(phase['time_weighted_gap'])} | {_ratio(phase['median_ratio'])} |")
    rep = report["repeatability"]
    fixed = report.get("fixed_cost") or {}
    lines += ["", "## Repeatability and throughput", "",
              f"- Two independent replays ({report['default_policy']}, seeds 0 and 1): median difference "
              f"{_pct(rep['median'])}, p90 {_pct(rep['p90'])} over {rep['rows']} rows.",
              f"- {report['replayed_rows']} rows replayed in {report['replay_wall_s']:.1f} s of wall time at "
              f"{report['repeat_count']} repetitions ({report['rows_per_s'] or 0:.1f} rows/s, every job's fixed cost "
              f"included); measured kernels fill {_pct(report['kernel_time_share'])} of it.",
              f"- Fixed cost of a one-row kernel-type job on a warm machine: {fixed.get('fixed_cost_s_median', '-')} s "
              f"(median of 3; `{fixed.get('kernel_type', '-')}`)."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "cuda_replay")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_cuda_replay"))
    parser.add_argument("--device", default="H100", help="device key of config/devices.yaml (default: %(default)s)")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=sorted(WORKLOADS))
    parser.add_argument("--policies", nargs="+", choices=CACHE_POLICIES, default=["insitu", "flush", "none"])
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    args = parser.parse_args()
    if DEFAULT_CACHE_POLICY not in args.policies:
        args.policies.insert(0, DEFAULT_CACHE_POLICY)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    wall_path = work / "stage_wall.json"
    wall = json.loads(wall_path.read_text()) if wall_path.exists() else {}
    if (work / ENVIRONMENT_FILE).exists() and "profile" not in args.stages:
        args.version_dir = json.loads((work / ENVIRONMENT_FILE).read_text()).get("version_dir") or version_dir()
    else:
        args.version_dir = version_dir()
    for stage, function in (("profile", stage_profile), ("parse", stage_parse), ("replay", stage_replay),
                            ("fixed", stage_fixed)):
        if stage in args.stages:
            print(f"== {stage}", flush=True)
            wall[stage] = function(work, args)
            wall_path.write_text(json.dumps(wall, indent=1))
            print(json.dumps(wall[stage]), flush=True)
    if any(stage in args.stages for stage in ("profile", "replay")):
        (work / ENVIRONMENT_FILE).write_text(json.dumps(environment(), indent=1))
    if "report" in args.stages:
        report = stage_report(work, args, json.loads((work / ENVIRONMENT_FILE).read_text()), wall, wall.get("fixed"))
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "cuda_replay.json").write_text(json.dumps(report, indent=1))
        (args.output / "cuda_replay.md").write_text(markdown(report))
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
