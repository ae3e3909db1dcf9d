"""CPU replay throughput: rows per second, and what a row costs beyond its kernel's own time.

For each kernel type (a cheap `add`, a compute-bound `mm`) and each row count, a CSV of that many
distinct rows (distinct shapes, so no two rows share a call) is replayed through the real job
(`replay_kernel_csv`: planning, one isolated child process, write-back, traces) with the default
repeat count. Kernel time per row is what the rows' own samples say the calls took:
(warm-up + repeat) x Average Duration(us). The rest is overhead: process start (torch import in
the child), building inputs, verifying outputs, the timing loop's own cost, write-back. A linear
fit over the row counts separates the per-job fixed cost from the per-row overhead.

    python benchmarks/replay_throughput.py               # writes benchmarks/results/replay_throughput.{json,md}
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


def fit(points: list[dict]) -> tuple[float, float]:
    """Least-squares wall = fixed + per_row x rows."""
    xs, ys = [p["rows"] for p in points], [p["wall_s"] for p in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - slope * mean_x, slope


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20/60 rows, results printed, not written")
    parser.add_argument("--repeat-count", type=int, default=30)
    args = parser.parse_args()
    counts = [1, 20, 60] if args.quick else [1, 50, 200]
    settings = ReplaySettings(repeat_count=args.repeat_count, warmup_count=3, timeout_s=600, cpu_threads=1)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for kernel_type in ("add", "mm"):
            for count in counts:
                result = measure(kernel_type, count, settings, Path(scratch))
                print(json.dumps(result))
                results.append(result)
    summary = []
    for kernel_type in ("add", "mm"):
        points = [r for r in results if r["kernel"] == kernel_type]
        fixed_s, per_row_s = fit(points)
        largest = points[-1]
        kernel_per_row_s = largest["kernel_s"] / largest["rows"]
        summary.append({"kernel": kernel_type, "job_fixed_s": round(fixed_s, 3),
                        "per_row_ms": round(per_row_s * 1e3, 3),
                        "kernel_per_row_ms": round(kernel_per_row_s * 1e3, 3),
                        "overhead_per_row_ms": round((per_row_s - kernel_per_row_s) * 1e3, 3),
                        "rows_per_s_at_largest": largest["rows_per_s"]})
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
               "load_average": os.getloadavg(), "note": "shared 2-core VM; other jobs ran concurrently"}
    table = ["| kernel | rows | wall s | kernel s | rows/s |", "|---|---:|---:|---:|---:|"]
    table += [f"| {r['kernel']} | {r['rows']} | {r['wall_s']} | {r['kernel_s']} | {r['rows_per_s']} |" for r in results]
    table += ["", "| kernel | job fixed cost s | per row ms | kernel per row ms | overhead per row ms | rows/s |",
              "|---|---:|---:|---:|---:|---:|"]
    table += [f"| {s['kernel']} | {s['job_fixed_s']} | {s['per_row_ms']} | {s['kernel_per_row_ms']} | "
              f"{s['overhead_per_row_ms']} | {s['rows_per_s_at_largest']} |" for s in summary]
    text = "\n".join(table)
    print(text)
    if not args.quick:
        out = REPO / "benchmarks" / "results"
        out.mkdir(parents=True, exist_ok=True)
        (out / "replay_throughput.json").write_text(json.dumps(
            {"machine": machine, "repeat_count": args.repeat_count, "warmup_count": 3, "runs": results,
             "summary": summary}, indent=2) + "\n")
        (out / "replay_throughput.md").write_text(
            "# CPU replay throughput (benchmarks/replay_throughput.py)\n\n"
            f"Machine: {machine['platform']}, {machine['cpu_count']} CPUs, Python {machine['python']}; "
            f"{machine['note']} (load average at the end {machine['load_average'][0]:.2f}). "
            f"repeat_count {args.repeat_count}, warm-up 3, 1 torch thread. Each run is one replay job: one isolated child process, "
            "write-back and traces included. Kernel time = (warm-up + repeat) x Average Duration(us) of the rows; "
            "overhead = per-row cost of the linear fit minus that.\n\n" + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
