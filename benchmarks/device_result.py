"""The JSON a device probe leaves under benchmarks/results/: what ran, where, when, and its numbers."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path

import torch


def write_device_result(directory: str | Path, script: str, **fields) -> Path:
    """Write {device, torch, date (UTC), command, **fields} to DIRECTORY/<device name>.json; return the path."""
    device = torch.cuda.get_device_name()
    document = {"device": device, "torch": torch.__version__,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]), **fields}
    path = Path(directory) / f"{device.replace(' ', '_')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {path}")
    return path


def probe_arguments(description: str, output: Path, trials: int, argv: list[str] | None = None):
    """A CUDA probe's command line (`--output`, `--trials`), refused where no CUDA device is visible."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(output))
    parser.add_argument("--trials", type=int, default=trials, help=f"alternating trials per case (default {trials})")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(sys.argv[0]).name} needs a CUDA device")
    return args


def calls_arguments(description: str, calls: int, argv: list[str] | None = None):
    """A CUDA probe's command line (`--calls` timed calls per case, `--json OUT`), refused where no CUDA device is
    visible."""
    import argparse

    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=calls, help=f"timed calls per case (default {calls})")
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(f"{Path(sys.argv[0]).name} needs a CUDA device")
    return args


def driver_version() -> str | None:
    """The NVIDIA driver's version as nvidia-smi reports it (None where it cannot be asked)."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip().splitlines()[0] if found.stdout.strip() else None


def write_json(path: Path | None, result: dict) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


def mean_device_us(prof, op: str) -> float:
    """Mean device time (µs) per call of `op` (`aten::cat`) in a finished torch.profiler session: its kernels'."""
    times = [event.self_device_time_total / event.count for event in prof.key_averages() if event.key == op]
    if not times:
        raise RuntimeError(f"the profiler recorded no {op} kernel")
    return times[0]
