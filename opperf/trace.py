"""Per-kernel traces a person can follow and re-run (adapted from the trace-module design, docs/design.md "Traces").

traces/{device}/{stack}/{version_dir}/{KernelType}/
  I{task_id}_S{step:02d}_{KernelType}_{ACTION}_{part}.txt   ACTION: PARSE|GRID|REPLAY|VERIFY|BACKFILL
                                                        part: spec|result|error_log
  I{task_id}_S{step:02d}_verify/replay_{KernelType}.py    standalone reproducer
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from opperf.io import write_text_atomic

ACTIONS = ("PARSE", "GRID", "REPLAY", "VERIFY", "BACKFILL")
PARTS = ("spec", "result", "error_log")


def default_task_id() -> str:
    """A task id unique enough to keep runs apart: $OPPERF_TASK_ID or a timestamp."""
    return os.environ.get("OPPERF_TASK_ID") or time.strftime("%Y%m%d%H%M%S")


class Trace:
    """Writes the trace files of one kernel type of one database."""

    def __init__(self, trace_dir: str | Path, kernel_type: str, task_id: str | None = None):
        self.kernel_type = kernel_type
        self.task_id = task_id or default_task_id()
        self.directory = Path(trace_dir) / kernel_type

    def file_for(self, step: int, action: str, part: str) -> Path:
        if action not in ACTIONS:
            raise ValueError(f"trace action {action!r} is not one of {ACTIONS}")
        if part not in PARTS:
            raise ValueError(f"trace part {part!r} is not one of {PARTS}")
        return self.directory / f"I{self.task_id}_S{step:02d}_{self.kernel_type}_{action}_{part}.txt"

    def record(self, step: int, action: str, part: str, text: str) -> Path:
        path = self.file_for(step, action, part)
        write_text_atomic(path, text if text.endswith("\n") else text + "\n")
        return path

    def verify_dir(self, step: int) -> Path:
        return self.directory / f"I{self.task_id}_S{step:02d}_verify"
