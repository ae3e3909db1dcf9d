#!/usr/bin/env python
"""What a few-µs CPU op's own profiler event measures, by what runs around the call.

The CPU replay times each call as the op's event under torch.profiler (record_shapes), inside a record_function
range of its own row (opperf/replay/timing.py, CpuProfilerTimer). Inside the workload the same op runs between the
model's Python lines and other ops, with no range of its own. This probe times the replay's few-µs ops (from
README's demo) in one process, 1 thread, the contexts alternated round by round so that a drifting machine moves
them alike:

  bare              the op back to back
  wrapped           each call in a record_function range (the replay timer's way)
  marker_after      each call followed by an empty record_function range (a marker outside the op)
  python_between    each call after a few µs of plain Python (a dict filled)
  other_op_between  each call after an elementwise op on a [1, 64, 256] tensor

and prints the median op event (µs) per context and op, and writes the table as JSON (--output).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

CONTEXTS = ("bare", "wrapped", "marker_after", "python_between", "other_op_between")


def cases() -> dict[str, tuple]:
    """label -> (op, args): the demo's few-µs rows (opperf-tiny, float32)."""
    return {"rsqrt [1,16,1]": (torch.ops.aten.rsqrt.default, (torch.rand(1, 16, 1) + 0.5,)),
            "pow [1,1,256]": (torch.ops.aten.pow.Tensor_Scalar, (torch.rand(1, 1, 256), 2)),
            "neg [1,8,16,16]": (torch.ops.aten.neg.default, (torch.rand(1, 8, 16, 16),)),
            "mul [1,64,256]x[1,64,1]": (torch.ops.aten.mul.Tensor, (torch.rand(1, 64, 256), torch.rand(1, 64, 1))),
            "add [1,1,256]x2": (torch.ops.aten.add.Tensor, (torch.rand(1, 1, 256), torch.rand(1, 1, 256)))}


def _python_work() -> dict:
    table = {}
    for i in range(30):
        table[i] = str(i)
    return table


def time_context(op, args, context: str, calls: int) -> float:
    """Median µs of the op's own event over `calls` calls in `context`."""
    filler = torch.rand(1, 64, 256)
    for _ in range(20):
        op(*args)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for call in range(calls):
            if context == "wrapped":
                with record_function(f"opperf_replay#{call % 7}"):
                    op(*args)
                continue
            if context == "python_between":
                _python_work()
            elif context == "other_op_between":
                torch.ops.aten.mul.Tensor(filler, 2.0)
            op(*args)
            if context == "marker_after":
                with record_function("opperf_marker"):
                    pass
    times = [e.cpu_time_total for e in prof.events() if e.name == op._schema.name]
    return statistics.median(times[-calls:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    samples: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for label, (op, op_args) in cases().items():
            for context in CONTEXTS:
                samples.setdefault(label, {}).setdefault(context, []).append(
                    time_context(op, op_args, context, args.calls))
    table = {label: {c: round(statistics.median(v), 3) for c, v in by.items()} for label, by in samples.items()}
    print("| op | " + " | ".join(CONTEXTS) + " |")
    print("|---|" + "---|" * len(CONTEXTS))
    for label, by in table.items():
        print(f"| {label} | " + " | ".join(f"{by[c]:.2f}" for c in CONTEXTS) + " |")
    if args.output:
        args.output.write_text(json.dumps({
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs",
            "torch": torch.__version__, "python": platform.python_version(), "load_average": os.getloadavg(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "rounds": args.rounds,
            "calls": args.calls, "median_op_event_us": table, "samples_us": samples}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
