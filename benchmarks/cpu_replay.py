#!/usr/bin/env python
"""Replay accuracy of the CPU back end on the demo workload, through the workflow's stages.

On this host's CPU:

  1. profile  scripts/profile_workload.py --backend cpu (the README demo workload: opperf-tiny, float32,
              prefill 16 and 64, 4 decode steps over a 64-token context), once per thread count, and a
              second time at the first thread count (how far two runs of the workload itself disagree)
  2. parse    scripts/parse_kernel_details.py → data/CPU/torch/{version_dir}/{Type}.csv
  3. replay   scripts/replay.py --database-path --backend cpu (a copy of the parsed database per run):
              at each thread count (the profiler timer, replay's one), replaying the profile taken at that count
              (the workflow runs both with 1 thread: Snakemake sets OMP_NUM_THREADS to a job's threads);
              and once more per --variant NAME:VAR=VALUE with that variable in the replay's environment (the
              fresh-pages run of results/cpu_replay/ was `fresh_pages:MALLOC_MMAP_THRESHOLD_=65536`: every tensor
              of 64 KiB or more a fresh mmap, its pages faulted in by the op that writes it first)
  4. phase    with --phase, stage 4b on a copy of that replay: scripts/phase_replay.py --device cpu --apply-to
  5. profile  once more at the first thread count, after the replays (how far the machine drifted while they ran)

and writes `cpu_replay.json` and `cpu_replay.md` in --output. Gap definitions are those of
benchmarks/cuda_replay.py (its `analyse_run`, imported): gap of a row = |1 - replay / profiled|, replay =
`Average Duration(us)`, profiled = `Profiling Average Duration(us)`; time-weighted gap = sum |replay -
profiled| x calls / sum profiled x calls. "outside band" counts rows whose ratio is outside 0.8–1.2 (the
report's `duration_gap_band`). The noise floor row compares the second profile with the first, row by
row (same signature), as if the second were a replay: no replay can be expected to agree better; the drift row
compares the profile after the replays with the first the same way. Either over 30 % of the rows outside marks the
run not settled.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cuda_replay import analyse_run, read_rows  # noqa: E402

from opperf import contract  # noqa: E402
from opperf.replay.engine import replay_key  # noqa: E402
from opperf.report.build import cpu_model  # noqa: E402

WORKLOAD = ["--model", "opperf-tiny", "--dtype", "float32", "--batch-size", "1", "--prefill-lengths", "16", "64",
            "--decode-steps", "4", "--decode-context", "64"]
BAND = (0.8, 1.2)
# Two profiles of the workload outside the band on more than this share of rows: the machine was not settled. On
# the GPU host's Xeon the first run after a boot had 56 and 73 of 94 rows apart, the second 1 and 15; the 2-core
# EPYC VM 13-25, and 91 on a busy host (results/cpu_replay/README.md).
UNSETTLED_SHARE = 0.3


def run(command: list[str], log_path: Path, env: dict | None = None) -> float:
    began = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        completed = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    elapsed = time.perf_counter() - began
    if completed.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(command)} failed ({completed.returncode}):\n{tail}")
    return elapsed


def version_dir() -> str:
    from opperf.versions import workload_version_dir

    return workload_version_dir("cpu")


def database(work: Path, name: str) -> Path:
    return work / name / "data" / "CPU" / "torch" / version_dir()


def environment() -> dict:
    import torch

    return {"machine": f"{cpu_model()}, {os.cpu_count()} logical CPUs", "hostname": platform.node(),
            "torch": torch.__version__, "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def outside_band(rows: list[dict]) -> int:
    count = 0
    for row in rows:
        try:
            ratio = float(row[contract.REPLAY_AVERAGE]) / float(row[contract.PROFILING_AVERAGE])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            continue
        count += not BAND[0] <= ratio <= BAND[1]
    return count


def profile_rows_as_replay(first: list[dict], second: list[dict]) -> list[dict]:
    """The first profile's rows with the second profile's time of the same call as their 'replay'."""
    other = {(r["_type"], replay_key(r, r["_type"])): r.get(contract.PROFILING_AVERAGE) for r in second}
    rows = []
    for row in first:
        value = other.get((row["_type"], replay_key(row, row["_type"])))
        if value:
            rows.append({**row, contract.REPLAY_AVERAGE: value, contract.REPLAY_STATUS: "second profile"})
    return rows


def row_ratios(replayed: dict[str, list[dict]], first: list[dict], after: list[dict]) -> list[dict]:
    """Per profiled row: its type, shapes and calls, the profiled mean before and after the replays, and each run's
    replayed mean (µs; `replayed`: each run's rows), for a look at single rows across runs."""
    key = {id(row): (row["_type"], replay_key(row, row["_type"])) for row in first}
    later = {(r["_type"], replay_key(r, r["_type"])): r.get(contract.PROFILING_AVERAGE) for r in after}
    replays = {name: {(r["_type"], replay_key(r, r["_type"])): r.get(contract.REPLAY_AVERAGE) for r in rows}
               for name, rows in replayed.items()}
    return [{"type": row["_type"], "shapes": row.get(contract.INPUT_SHAPES, ""),
             "calls": row.get(contract.PROFILING_SAMPLE_COUNT, ""), "profiled_us": row.get(contract.PROFILING_AVERAGE),
             "profiled_after_us": later.get(key[id(row)]),
             **{f"{name}_us": replays[name].get(key[id(row)]) for name in replayed}} for row in first]


def summarise(rows: list[dict]) -> dict:
    result = analyse_run(rows)
    result["outside_band"] = outside_band(rows)
    for name, detail in result["per_type"].items():
        detail["outside_band"] = outside_band([r for r in rows if r["_type"] == name])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "cpu_replay")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_cpu_replay"))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                        help="torch threads of the workload and of its replay (default: %(default)s)")
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--profile-iterations", type=int, default=1,
                        help="passes of the workload under the profiler: each row's profiled mean over that many "
                             "times its calls (config workload.profile_iterations; default: %(default)s)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE",
                        help="an extra replay of the first thread count with an environment variable set")
    parser.add_argument("--phase", action="store_true",
                        help="also stage 4b on a copy of the first thread count's replay: the workload's calls "
                             "replayed in its order and folded into the rows (scripts/phase_replay.py --apply-to), "
                             "as the workflow does where replay.phase.backends lists cpu")
    args = parser.parse_args()
    work = args.work_dir
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    load_before = os.getloadavg()
    wall: dict[str, float] = {}

    def profile(name: str, threads: int) -> None:
        print(f"== {name}", flush=True)
        wall[name] = run([sys.executable, "scripts/profile_workload.py", "--backend", "cpu", *WORKLOAD,
                          "--profile-iterations", str(args.profile_iterations), "--output", str(work / name / "profile")],
                         work / f"{name}.log", {"OMP_NUM_THREADS": str(threads)})
        run([sys.executable, "scripts/parse_kernel_details.py", "--profiling-path",
             str(work / name / "profile" / "trace.json"), "--database-path", str(database(work, name))],
            work / f"{name}_parse.log")

    for threads in args.threads:
        profile(f"profile_t{threads}", threads)
    profile(f"profile_t{args.threads[0]}_again", args.threads[0])
    runs, replayed = {}, {}

    def measure(name: str, source: str, log: str, command, env: dict | None = None, **fields) -> None:
        """`command(target)` run on a copy of `source`'s database at `target`, its rows summarised into runs[name]
        beside `fields` (timing, threads, profile)."""
        target = database(work, name)
        target.parent.mkdir(parents=True)
        shutil.copytree(database(work, source), target)
        print(f"== {log} {name}", flush=True)
        wall[name] = run(command(target), work / f"{log}_{name}.log", env)
        rows = replayed[name] = read_rows(target)
        runs[name] = {**fields, "method": next((r.get(contract.REPLAY_TIMING_METHOD) for r in rows
                                                 if r.get(contract.REPLAY_TIMING_METHOD)), ""),
                      "replay_wall_s": wall[name], **summarise(rows)}

    def replay(name: str, threads: int, timing: str, env: dict | None = None) -> None:
        """The profile taken at `threads` threads replayed with as many (the profiler timer, replay's one CPU timer
        since issue 42)."""
        measure(name, f"profile_t{threads}", "replay",
                lambda target: [sys.executable, "scripts/replay.py", "--database-path", str(target), "--backend",
                                "cpu", "--device", "CPU", "--repeat-count", str(args.repeat_count),
                                "--cpu-threads", str(threads), "--reports-dir", str(work / name / "reports")],
                env, timing=timing, threads=threads, profile=f"profile_t{threads}")

    for threads in args.threads:
        replay(f"profiler_t{threads}", threads, "profiler")
    for variant in args.variant:
        name, _, assignment = variant.partition(":")
        var, _, value = assignment.partition("=")
        replay(f"profiler_t{args.threads[0]}_{name}", args.threads[0], f"profiler, {var}={value}", {var: value})
    if args.phase:
        threads = args.threads[0]
        name = f"profiler_t{threads}_phase"
        measure(name, f"profiler_t{threads}", "phase",
                lambda target: [sys.executable, "scripts/phase_replay.py", "--profiling-path",
                                str(work / f"profile_t{threads}" / "profile" / "trace.json"), "--rows", str(target),
                                "--output", str(work / name / "phase_replay.csv"), "--apply-to", str(target),
                                "--device", "cpu"],
                {"OMP_NUM_THREADS": str(threads)}, timing="profiler, then stage 4b (in the workload's order)",
                threads=threads, profile=f"profile_t{threads}")
    # The machine may change speed while the replays run (a cloud host's neighbours): a third profile after them
    # says by how much, which the back-to-back pair cannot.
    profile(f"profile_t{args.threads[0]}_after", args.threads[0])
    first = read_rows(database(work, f"profile_t{args.threads[0]}"))
    floor = summarise(profile_rows_as_replay(first, read_rows(database(work, f"profile_t{args.threads[0]}_again"))))
    after = read_rows(database(work, f"profile_t{args.threads[0]}_after"))
    drift = summarise(profile_rows_as_replay(first, after))
    settled = max(floor["outside_band"], drift["outside_band"]) <= UNSETTLED_SHARE * floor["rows"]
    if not settled:
        print(f"warning: the workload's profiles disagree on {floor['outside_band']} (back to back) and "
              f"{drift['outside_band']} (before and after the replays) of {floor['rows']} rows (over "
              f"{UNSETTLED_SHARE:.0%}): the machine is not settled and this run's replay figures say nothing",
              file=sys.stderr)
    report = {"environment": environment(), "load_average_before": load_before, "load_average_after": os.getloadavg(),
              "repeat_count": args.repeat_count, "profile_iterations": args.profile_iterations,
              "workload": " ".join(WORKLOAD), "band": BAND, "runs": runs,
              "noise_floor": {"threads": args.threads[0], **floor}, "drift": {"threads": args.threads[0], **drift},
              "settled": settled, "stage_wall_s": wall, "rows": row_ratios(replayed, first, after)}
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "cpu_replay.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.output / "cpu_replay.md").write_text(text)
    print(text)
    return 0


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(report: dict) -> str:
    env = report["environment"]
    load = ", ".join(f"{v:.2f}" for v in report["load_average_before"])
    load_after = ", ".join(f"{v:.2f}" for v in report["load_average_after"])
    lines = [f"# CPU replay accuracy ({env['date'][:10]})", "",
             f"{env['machine']}; torch {env['torch']}, Python {env['python']}; load average {load} before, "
             f"{load_after} after. Workload `{report['workload']}`; {report.get('profile_iterations', 1)} profiled "
             f"pass(es); repeat count {report['repeat_count']}. "
             "Produced by `python benchmarks/cpu_replay.py` (definitions in its docstring).", "",
             "| run | timing | threads (workload = replay) | rows | outside 0.8–1.2 | median gap | p90 gap | "
             "time-weighted gap | median replay/profiled |", "|---|---|---|---|---|---|---|---|---|"]
    floor = report["noise_floor"]
    if not report.get("settled", True):
        drifted = report.get("drift", {}).get("outside_band", "-")
        lines[4:4] = [f"**Not settled:** the workload's profiles disagree on {floor['outside_band']} (back to back) and "
                      f"{drifted} (before and after the replays) of {floor['rows']} rows (over "
                      f"{UNSETTLED_SHARE:.0%}); this run's replay figures say nothing.", ""]
    for label, compared in (("second profile vs first", floor),
                            ("profile after the replays vs first", report.get("drift"))):
        if compared:
            lines.append(f"| {label} | - | {compared['threads']} | {compared['rows']} | {compared['outside_band']} | "
                         f"{_pct(compared['median_gap'])} | {_pct(compared['p90_gap'])} | "
                         f"{_pct(compared['time_weighted_gap'])} | {_ratio(compared['median_ratio'])} |")
    for name, r in report["runs"].items():
        lines.append(f"| {name} | {r['timing']} | {r['threads']} | {r['rows']} | {r['outside_band']} | "
                     f"{_pct(r['median_gap'])} | {_pct(r['p90_gap'])} | {_pct(r['time_weighted_gap'])} | "
                     f"{_ratio(r['median_ratio'])} |")
    names = list(report["runs"])
    types = sorted({t for r in report["runs"].values() for t in r["per_type"]},
                   key=lambda t: -max(r["per_type"].get(t, {}).get("profiled_time_share", 0)
                                      for r in report["runs"].values()))
    lines += ["", "## Per kernel type: median gap (median replay/profiled)", "",
              "| type | rows | share of workload time | noise floor | " + " | ".join(names) + " |",
              "|---|---|---|---|" + "---|" * len(names)]
    for name in types:
        first = report["runs"][names[0]]["per_type"].get(name, {})
        noise = floor["per_type"].get(name)
        cells = []
        for run_name in names:
            t = report["runs"][run_name]["per_type"].get(name)
            cells.append(f"{_pct(t['median_gap'])} ({_ratio(t['median_ratio'])})" if t else "-")
        lines.append(f"| {name} | {first.get('rows', '-')} | {_pct(first.get('profiled_time_share'))} | "
                     f"{_pct(noise['median_gap']) if noise else '-'} | " + " | ".join(cells) + " |")
    for run_name in names:
        lines += ["", f"## Worst rows of {run_name} (by |replay - profiled| x calls)", "",
                  "| row | replay µs | profiled µs | ratio | calls | input shapes |", "|---|---|---|---|---|---|"]
        for w in report["runs"][run_name]["worst_rows"][:8]:
            lines.append(f"| {w['type']} {w['line']} | {w['replay_us']:.2f} | {w['profiled_us']:.2f} | "
                         f"{w['ratio']:.2f} | {w['calls']} | `{w['shapes']}` |")
    lines += ["", "Stage wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in report["stage_wall_s"].items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
