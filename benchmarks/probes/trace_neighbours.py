#!/usr/bin/env python
"""What a profiled call ran on the device, and what ran just before it: one torch.profiler trace, the calls of one op
whose Input Dims start with the given shapes.

For a row that replays far from its profile, this answers which kernel or memcpy the workload launched for it (a
`Memcpy DtoD` or an elementwise copy kernel, for instance), how long each took, the device activity before it and
the idle gap between them.

    python benchmarks/probes/trace_neighbours.py TRACE.json[.gz] aten::copy_ "512,2816;512,2816" [--limit 5]
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from opperf.parse.torch_trace import input_shapes_field  # noqa: E402

DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", type=Path)
    parser.add_argument("op", help="the op's name in the trace, e.g. aten::copy_")
    parser.add_argument("dims", help="its Input Dims as the database writes them, e.g. 512,2816;512,2816 (a prefix)")
    parser.add_argument("--limit", type=int, default=5, help="calls to show (default %(default)s)")
    args = parser.parse_args(argv)
    opener = gzip.open if args.trace.suffix == ".gz" else open
    with opener(args.trace, "rt", encoding="utf-8") as handle:
        events = json.load(handle)["traceEvents"]
    device = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    by_correlation = {}
    for event in device:
        by_correlation.setdefault(event.get("args", {}).get("correlation"), []).append(event)
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime" and "dur" in e), key=lambda e: e["ts"])
    runtime_starts = [e["ts"] for e in runtime]
    device_starts = [e["ts"] for e in device]
    shown = 0
    for op in sorted((e for e in events if e.get("cat") == "cpu_op" and e.get("name") == args.op),
                     key=lambda e: e["ts"]):
        if not input_shapes_field(op.get("args", {})).startswith(args.dims):
            continue
        launched = []
        for call in runtime[bisect.bisect_left(runtime_starts, op["ts"]):
                            bisect.bisect_right(runtime_starts, op["ts"] + op["dur"])]:
            if call.get("tid") == op.get("tid"):
                launched += by_correlation.get(call.get("args", {}).get("correlation"), [])
        if not launched:
            continue
        first = min(launched, key=lambda e: e["ts"])
        position = bisect.bisect_left(device_starts, first["ts"])
        before = device[position - 1] if position else None
        print(f"{args.op} {input_shapes_field(op['args'])} strides {op['args'].get('Input Strides')}")
        for activity in sorted(launched, key=lambda e: e["ts"]):
            print(f"  ran   {activity['dur']:9.3f} us  {activity['cat']:10s} {activity['name'][:110]}")
        if before is not None:
            gap = first["ts"] - (before["ts"] + before["dur"])
            print(f"  after {before['dur']:9.3f} us  {before['cat']:10s} {before['name'][:110]}  (gap {gap:.3f} us)")
        shown += 1
        if shown >= args.limit:
            break
    if not shown:
        print(f"no {args.op} call with Input Dims starting {args.dims!r} launched device work in {args.trace}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
