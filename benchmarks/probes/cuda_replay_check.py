"""Validate the CUDA timer on a real GPU: replay a few mm/add rows, print both timings side by side.

For each row and each cache policy (insitu, flush, rotate, none) the row is replayed twice: timed by the
device-kernel time the profiler (CUPTI) attributes to each call's range, and by CUDA events around it. Expect: both positive; kernel time <= event time (events include launch gaps); `none`
(warm L2) <= `flush` for small, memory-bound rows; mm times that grow with M*N*K. The script also
replays the same rows through the full job (isolated child, write-back) on `--device-id`, and fails
(exit 1) if any row does not come back `ok`.

    python benchmarks/probes/cuda_replay_check.py                 # on an H100/H200 host
    python benchmarks/probes/cuda_replay_check.py --repeat-count 100 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from opperf import contract  # noqa: E402

ROWS = [
    ("mm", "4096,4096;4096,4096", "DT_BF16;DT_BF16", "4096,4096", "DT_BF16", ""),
    ("mm", "128,7168;7168,2048", "DT_BF16;DT_BF16", "128,2048", "DT_BF16", ""),
    ("mm", "16,256;256,512", "DT_FLOAT;DT_FLOAT", "16,512", "DT_FLOAT", ""),
    ("add", "8192,8192;8192,8192;", "DT_BF16;DT_BF16;", "8192,8192", "DT_BF16", ";;1"),
    ("add", "1,16,256;1,16,256;", "DT_FLOAT;DT_FLOAT;", "1,16,256", "DT_FLOAT", ";;1"),
]


def row_dict(shapes, dtypes, out_shapes, out_dtypes, scalars):
    return {contract.OP_STATE: "eager", contract.ACCELERATOR_CORE: "CUDA", contract.INPUT_SHAPES: shapes,
            contract.INPUT_DTYPES: dtypes, contract.INPUT_FORMATS: ";".join("ND" if s else "" for s in shapes.split(";")),
            contract.OUTPUT_SHAPES: out_shapes, contract.OUTPUT_DTYPES: out_dtypes, contract.OUTPUT_FORMATS: "ND",
            contract.INPUT_SCALARS: scalars}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat-count", type=int, default=30)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    import pandas as pd
    import torch

    from opperf.replay.definitions import load_definition
    from opperf.replay.engine import replay_row
    from opperf.replay.job import ReplaySettings, replay_kernel_csv
    from opperf.replay.timing import METHOD_CUDA_KERNEL, CudaTimer

    if not torch.cuda.is_available():
        print("no CUDA device: run this on a GPU host", file=sys.stderr)
        return 2
    device = f"cuda:{args.device_id}"
    torch.cuda.set_device(device)
    print(f"device {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"L2 {torch.cuda.get_device_properties(device).L2_cache_size // 1024} KiB")
    results, failures = [], 0
    header = f"{'kernel':5} {'shapes':28} {'L2':6} {'kernel us (CUPTI)':>18} {'event us':>10} {'kernel/event':>12}  status"
    print(header)
    for kernel_type, shapes, dtypes, out_shapes, out_dtypes, scalars in ROWS:
        definition = load_definition(REPO / "config" / "kernels" / "torch" / f"{kernel_type}.yaml")
        row = row_dict(shapes, dtypes, out_shapes, out_dtypes, scalars)
        for policy in ("insitu", "flush", "rotate", "none"):
            outcome, events = (replay_row(definition, row, backend="cuda", device=device,
                                          timer=CudaTimer(device, l2_policy=policy, primary=primary),
                                          repeat_count=args.repeat_count) for primary in ("kernel", "event"))
            if events.status != "ok":
                outcome = events
            if outcome.status != "ok":
                failures += 1
                print(f"{kernel_type:5} {shapes:28} {policy:6} {'':>18} {'':>10} {'':>12}  {outcome.status}: "
                      f"{outcome.error}")
                continue
            kernel_us = float(outcome.columns[contract.REPLAY_AVERAGE])
            event_us = float(events.columns[contract.REPLAY_AVERAGE])
            print(f"{kernel_type:5} {shapes:28} {policy:6} {kernel_us:18.3f} {event_us:10.3f} "
                  f"{kernel_us / event_us:12.3f}  ok ({outcome.columns[contract.REPLAY_L2_POLICY]})")
            results.append({"kernel": kernel_type, "shapes": shapes, "l2_policy": policy, "kernel_us": kernel_us,
                            "event_us": event_us, "method": METHOD_CUDA_KERNEL,
                            "l2": outcome.columns[contract.REPLAY_L2_POLICY]})
    with tempfile.TemporaryDirectory() as scratch:
        for kernel_type in ("mm", "add"):
            rows = [row_dict(*r[1:]) for r in ROWS if r[0] == kernel_type]
            path = Path(scratch) / f"{kernel_type}.csv"
            pd.DataFrame(rows).to_csv(path, index=False)
            settings = ReplaySettings(backend="cuda", repeat_count=args.repeat_count, device_ids=[args.device_id],
                                      slots_dir=Path(scratch) / "slots")
            job = replay_kernel_csv(path, kernel_type, REPO / "config" / "kernels" / "torch", path, settings,
                                    version_dir=None)
            statuses = job.status_counts()
            print(f"full job {kernel_type}: {job.writeback.summary()}; statuses {statuses}")
            failures += sum(v for k, v in statuses.items() if k != "ok")
        failures += concurrent_jobs_check(Path(scratch), torch.cuda.device_count(), args.repeat_count)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if failures else 0


def concurrent_jobs_check(scratch: Path, device_count: int, repeat_count: int) -> int:
    """As under `snakemake --resources gpu=K`: K replay jobs at once must each hold a distinct GPU."""
    import re
    import subprocess

    import pandas as pd

    if device_count < 2:
        print("one GPU: concurrent-jobs check skipped")
        return 0
    jobs = min(device_count, 4)
    ids = ",".join(str(i) for i in range(jobs))
    processes = []
    for index in range(jobs):
        rows = scratch / f"concurrent_{index}.csv"
        pd.DataFrame([row_dict("4096,4096;4096,4096", "DT_BF16;DT_BF16", "4096,4096", "DT_BF16", "")] * 1).to_csv(
            rows, index=False)
        log = open(scratch / f"concurrent_{index}.log", "w")
        processes.append((subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / "replay.py"), "--rows", str(rows), "--kernel", "mm",
             "--definition", str(REPO / "config" / "kernels" / "torch" / "mm.yaml"), "--backend", "cuda",
             "--output", str(scratch / f"concurrent_{index}_out.csv"), "--repeat-count", str(repeat_count * 20),
             "--device-ids", ids, "--slots-dir", str(scratch / "concurrent_slots")],
            stdout=log, stderr=subprocess.STDOUT), log, index))
    held, failures = [], 0
    for process, log, index in processes:
        process.wait()
        log.close()
        text = (scratch / f"concurrent_{index}.log").read_text()
        match = re.search(r"holding cuda device (\d+)", text)
        held.append(int(match.group(1)) if match else None)
        failures += process.returncode != 0
    distinct = None not in held and len(set(held)) == len(held)
    print(f"concurrent jobs: {jobs} replay jobs held cuda devices {held} -> "
          f"{'distinct' if distinct else 'NOT distinct'}; exit codes ok: {failures == 0}")
    return failures + (0 if distinct else 1)


if __name__ == "__main__":
    sys.exit(main())
