"""CPU replay throughput: rows per second, and what a row costs beyond its kernel's own time.

For each kernel type (a cheap `add`, a compute-bound `mm`) and each row count, a CSV of that many
distinct rows (distinct shapes, so no two rows share a call) is replayed through the real job
(`replay_kernel_csv`: planning, one isolated child process, write-back, traces) with the default
repeat count, and once more in-process through the engine alone. Kernel time per row is what the
rows' own samples say the calls took: (warm-up + repeat) x Average Duration(us); the rest of the
engine's per-row time is overhead (building inputs, verifying outputs, the timing loop, statistics).
A 1-row job gives the per-job fixed cost (the child's start, torch import included).

    python benchmarks/replay_throughput.py               # writes benchmarks/results/replay_throughput/
    python benchmarks/replay_throughput.py --quick       # fewer rows, prints only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from opperf import contract  # noqa: E402
from opperf.replay.job import ReplaySettings, replay_kernel_csv  # noqa: E402


def rows_for(kernel_type: str, count: int) -> list[dict]:
    """`count` distinct real-looking rows: the decoder's shapes with the token dimension varied."""
    rows = []
    for index in range(count):
        tokens = 1 + index
        if kernel_type == "mm":
            shapes, out = f"{tokens},256;256,512", f"{tokens},512"
            dtypes, out_dtypes, formats, scalars = "DT_FLOAT;DT_FLOAT", "DT_FLOAT", "ND;ND", ""
        else:
            shapes, out = f"1,{tokens},256;1,{tokens},256;", f"1,{tokens},256"
            dtypes, out_dtypes, formats, scalars = "DT_FLOAT;DT_FLOAT;", "DT_FLOAT", "ND;ND;", ";;1"
        rows.append({contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CPU", contract.INPUT_SHAPES: shapes,
                     contract.INPUT_DTYPES: dtypes, contract.INPUT_FORMATS: formats, contract.OUTPUT_SHAPES: out,
                     contract.OUTPUT_DTYPES: out_dtypes, contract.OUTPUT_FORMATS: "ND",
                     contract.INPUT_SCALARS: scalars})
    return rows


def measure(kernel_type: str, count: int, settings: ReplaySettings, scratch: Path) -> dict:
    rows_path = scratch / f"{kernel_type}_{count}.csv"
    pd.DataFrame(rows_for(kernel_type, count)).to_csv(rows_path, index=False)
    output = scratch / f"{kernel_type}_{count}_out.csv"
    start = time.perf_counter()
    job = replay_kernel_csv(rows_path, kernel_type, REPO / "config" / "kernels" / "torch", output, settings,
                            version_dir=None, trace_dir=scratch / "traces")
    wall_s = time.perf_counter() - start
    frame = pd.read_csv(output, dtype=str, keep_default_na=False)
    statuses = frame[contract.REPLAY_STATUS].value_counts().to_dict()
    calls = settings.warmup_count + settings.repeat_count
    kernel_s = sum(float(v) for v in frame[contract.REPLAY_AVERAGE] if v) * calls / 1e6
    return {"kernel": kernel_type, "rows": count, "wall_s": round(wall_s, 3), "kernel_s": round(kernel_s, 4),
            "rows_per_s": round(count / wall_s, 2), "statuses": statuses, "writeback": job.writeback.summary()}


def in_process(kernel_type: str, count: int, settings: ReplaySettings) -> dict:
    """The engine alone (no child process): per-row wall time vs the row's kernel time."""
    from opperf.replay.definitions import load_definition
    from opperf.replay.engine import replay_row
    from opperf.replay.timing import CpuProfilerTimer

    definition = load_definition(REPO / "config" / "kernels" / "torch" / f"{kernel_type}.yaml")
    timer = CpuProfilerTimer(settings.cpu_threads)
    calls = settings.warmup_count + settings.repeat_count
    kernel_s = 0.0
    start = time.perf_counter()
    for row in rows_for(kernel_type, count):
        outcome = replay_row(definition, row, backend="cpu", device="cpu", timer=timer,
                             repeat_count=settings.repeat_count, warmup_count=settings.warmup_count)
        assert outcome.status == "ok", outcome.error
        kernel_s += float(outcome.columns[contract.REPLAY_AVERAGE]) * calls / 1e6
    wall_s = time.perf_counter() - start
    return {"kernel": kernel_type, "rows": count, "wall_s": round(wall_s, 3), "kernel_s": round(kernel_s, 4),
            "per_row_ms": round(wall_s / count * 1e3, 3), "kernel_per_row_ms": round(kernel_s / count * 1e3, 3),
            "overhead_per_row_ms": round((wall_s - kernel_s) / count * 1e3, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rows, results printed, not written")
    parser.add_argument("--repeat-count", type=int, default=30)
    args = parser.parse_args()
    rows = 50 if args.quick else 500
    settings = ReplaySettings(repeat_count=args.repeat_count, warmup_count=3, timeout_s=600, cpu_threads=1)
    jobs, engine = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for kernel_type in ("add", "mm"):
            for count in (1, 1, 1, rows):
                jobs.append(measure(kernel_type, count, settings, Path(scratch)))
                print(json.dumps(jobs[-1]))
            engine.append(in_process(kernel_type, rows, settings))
            print(json.dumps(engine[-1]))
    summary = []
    for kernel_type in ("add", "mm"):
        single = sorted(j["wall_s"] for j in jobs if j["kernel"] == kernel_type and j["rows"] == 1)
        full = next(j for j in jobs if j["kernel"] == kernel_type and j["rows"] == rows)
        alone = next(e for e in engine if e["kernel"] == kernel_type)
        summary.append({"kernel": kernel_type, "job_fixed_s_median_of_3": single[1], "rows": rows,
                        "job_wall_s": full["wall_s"], "job_rows_per_s": full["rows_per_s"],
                        "engine_per_row_ms": alone["per_row_ms"], "kernel_per_row_ms": alone["kernel_per_row_ms"],
                        "overhead_per_row_ms": alone["overhead_per_row_ms"]})
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
               "load_average": os.getloadavg(), "note": "2-core VM; see the load average for other work running meanwhile"}
    table = ["| kernel | rows | job fixed cost s (1-row job, median of 3) | job wall s | job rows/s | "
             "engine per row ms | kernel per row ms | overhead per row ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    table += [f"| {s['kernel']} | {s['rows']} | {s['job_fixed_s_median_of_3']} | {s['job_wall_s']} | "
              f"{s['job_rows_per_s']} | {s['engine_per_row_ms']} | {s['kernel_per_row_ms']} | "
              f"{s['overhead_per_row_ms']} |" for s in summary]
    text = "\n".join(table)
    print(text)
    if not args.quick:
        out = REPO / "benchmarks" / "results" / "replay_throughput"
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay_throughput.json").write_text(json.dumps(
            {"machine": machine, "repeat_count": args.repeat_count, "warmup_count": 3, "cpu_threads": 1,
             "jobs": jobs, "engine": engine, "summary": summary}, indent=2) + "\n")
        (out / "README.md").write_text(
            "# CPU replay throughput\n\nCommand: `python benchmarks/replay_throughput.py`. "
            f"Machine: {machine['platform']}, {machine['cpu_count']} CPUs, Python {machine['python']}; "
            f"{machine['note']} (1-minute load average at the end: {machine['load_average'][0]:.2f}). "
            f"repeat_count {args.repeat_count}, warm-up 3, 1 torch thread, distinct rows (no shared calls).\n\n"
            "- *job*: the real replay job (`replay_kernel_csv`: plan, one isolated child process, write-back, "
            "traces). Its fixed cost is a 1-row job (mostly the child's torch import).\n"
            "- *engine*: the same rows replayed in-process by `engine.replay_row`; kernel time per row = "
            "(warm-up + repeat) x the row's Average Duration(us); overhead = the rest (input building, output "
            "verification, the timing loop, statistics).\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
