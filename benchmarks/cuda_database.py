#!/usr/bin/env python
"""A grid-extended, replayed database on one device, checked as its consumer will use it.

The workflow's stages run as their scripts (the GPU host has no Snakemake), in the workflow's order:

  1. profile   scripts/profile_workload.py: the reference decoder at a model's dims (bf16, 2 layers)
  2. parse     scripts/parse_kernel_details.py → the parsed database
  3. grid      scripts/generate_shape_grid.py --target-models MODEL: rows that meet the density standard, and
               --consumer-models: a row per op query the performance model issues for those models
  4. replay    scripts/replay.py --database-path: every row, profiled and generated, on the device
  5. database  scripts/build_database.py directory: the runtime's CSVs, layouts/, op_mapping.yaml
  6. check     scripts/check_database.py: findable rows, unique runtime keys, density, holdout interpolation
               error, and the consumer's queries end to end (none may fall back to roofline)

    python benchmarks/cuda_database.py --output-dir /tmp/out            # on an H100: ~8 min
    python benchmarks/cuda_database.py --backend cpu --model opperf-tiny --rows 40 --output-dir /tmp/smoke

Writes under --output-dir: `database.tar.gz` (the database directory), `check.json` / `check.md` (the
check), `timings.json` (stage wall times, device, torch, driver, date) and `logs.tar.gz`.
Exit 1 if a stage fails or the check does not pass.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


STAGES = ("profile", "parse", "grid", "replay", "database", "check")


def run(command: list[str], log_path: Path) -> float:
    """Run one stage script from the repository root, its output in `log_path`; its wall time in seconds."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(" ".join(command) + "\n")
        log.flush()
        completed = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    print(f"{log_path.stem:10} {wall:8.1f} s  exit {completed.returncode}", flush=True)
    if completed.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-20:]
        raise SystemExit(f"{log_path.stem} failed (exit {completed.returncode}):\n" + "\n".join(tail))
    return wall


def environment(backend: str) -> dict:
    import torch

    info = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node()}
    if backend == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["nvidia_smi"] = smi.stdout.strip()
    return info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--device", default=None, help="device catalog key (default: H100 for cuda, CPU for cpu)")
    parser.add_argument("--model", default="Qwen3-32B", help="config/models.yaml model profiled and gridded")
    parser.add_argument("--prefill-lengths", nargs="+", type=int, default=[128, 512, 2048, 4096])
    parser.add_argument("--decode-batch-sizes", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--rows", type=int, default=0, help="grid row cap per kernel type (0: none)")
    parser.add_argument("--consumer-models", default="Qwen3-32B,DeepSeek-V3",
                        help="models whose performance-model queries become grid rows and are checked end to end "
                             "('' for none; default: %(default)s)")
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/opperf_cuda_database"))
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES),
                        help="run only these stages on the work directory's earlier results (default: all)")
    args = parser.parse_args()
    device = args.device or ("H100" if args.backend == "cuda" else "CPU")
    dtype = "bfloat16" if args.backend == "cuda" else "float32"

    from opperf.versions import workload_version_dir

    version_dir = workload_version_dir(args.backend)
    work = args.work_dir
    if "profile" in args.stages and work.exists():
        shutil.rmtree(work)
    rows_dir = work / "data" / device / "torch" / version_dir
    database = work / "database" / device / "torch" / version_dir
    logs = work / "logs"
    args.output_dir.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    timings_path = work / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}

    def stage(name: str, command: list[str]) -> None:
        if name in args.stages:
            timings[name] = run(command, logs / f"{name}.log")
            timings_path.write_text(json.dumps(timings))

    stage("profile", [python, "scripts/profile_workload.py", "--backend", args.backend, "--dtype", dtype,
                              "--model", args.model, "--num-layers", "2",
                              "--prefill-lengths", *map(str, args.prefill_lengths),
                              "--decode-batch-sizes", *map(str, args.decode_batch_sizes),
                              "--decode-context", "1024", "--decode-steps", "2",
                              "--output", str(work / "profile")])
    stage("parse", [python, "scripts/parse_kernel_details.py", "--profiling-path",
                            str(work / "profile" / "trace.json"), "--database-path", str(rows_dir)])
    consumer = ["--consumer-models", args.consumer_models, "--consumer-dtype", dtype] if args.consumer_models else []
    stage("grid", [python, "scripts/generate_shape_grid.py", "--data-dir", str(rows_dir), "--device", device,
                           "--backend", args.backend, "--target-models", args.model, "--rows", str(args.rows),
                           *consumer])
    stage("replay", [python, "scripts/replay.py", "--database-path", str(rows_dir), "--backend",
                             args.backend, "--device", device, "--repeat-count", str(args.repeat_count),
                             "--reports-dir", str(work / "reports")])
    stage("database", [python, "scripts/build_database.py", "directory", "--rows-dir", str(rows_dir),
                               "--device", device, "--output", str(database), "--overwrite"])
    if "check" not in args.stages:
        return 0
    check_json, check_md = args.output_dir / "check.json", args.output_dir / "check.md"
    started = time.monotonic()
    check = subprocess.run([python, "scripts/check_database.py", str(database), "--json", str(check_json),
                            "--markdown", str(check_md), "--target-models", args.model, *consumer],
                           cwd=ROOT, capture_output=True, text=True)
    timings["check"] = time.monotonic() - started
    print(check.stdout[-4000:], check.stderr[-2000:], sep="\n")
    with tarfile.open(args.output_dir / "database.tar.gz", "w:gz") as archive:
        archive.add(database, arcname=f"{device}/torch/{version_dir}")
    with tarfile.open(args.output_dir / "logs.tar.gz", "w:gz") as archive:
        archive.add(logs, arcname="logs")
    rows = sum(1 for p in rows_dir.glob("*.csv") for _ in open(p, encoding="utf-8")) - len(list(rows_dir.glob("*.csv")))
    document = {"device": device, "backend": args.backend, "model": args.model, "version_dir": version_dir,
                "rows_replayed": rows, "stage_seconds": {k: round(v, 1) for k, v in timings.items()},
                "environment": environment(args.backend), "check_exit": check.returncode}
    (args.output_dir / "timings.json").write_text(json.dumps(document, indent=1) + "\n")
    return 0 if check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
