"""The JSON a device probe leaves under benchmarks/results/: what ran, where, when, and its numbers."""

from __future__ import annotations

import datetime
import json
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
