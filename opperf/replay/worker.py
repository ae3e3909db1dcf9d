"""The replay child process: replays the listed rows of one kernel type, reporting each as it goes.

Run by `opperf.replay.isolation` (never by hand: use scripts/replay.py). Each row is announced
before it starts and its outcome appended after it ends, one JSON object per line, flushed, so the
parent knows which row was running if this process aborts, hangs or is killed for memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from opperf.io import read_database_csv


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--definition", required=True)
    parser.add_argument("--backend", required=True, choices=["cpu", "cuda", "npu"])
    parser.add_argument("--indices", required=True, help="file with one 0-based row index per line")
    parser.add_argument("--progress", required=True, help="JSON-lines progress file to append to")
    parser.add_argument("--repeat-count", type=int, required=True)
    parser.add_argument("--warmup-count", type=int, required=True)
    parser.add_argument("--memory-budget-bytes", type=int, default=None)
    parser.add_argument("--l2-policy", default="flush")
    parser.add_argument("--cuda-timing", default="kernel", choices=["kernel", "event"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=None)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # Imports after argument parsing: a bad command line fails fast, before torch loads.
    from opperf.replay.definitions import load_definition
    from opperf.replay.engine import replay_row
    from opperf.replay.timing import device_for, make_timer

    frame = read_database_csv(args.rows)
    rows = frame.to_dict(orient="records")
    definition = load_definition(args.definition)
    timer = make_timer(args.backend, l2_policy=args.l2_policy, cuda_primary=args.cuda_timing,
                       cpu_threads=args.cpu_threads)
    format_cast = format_cast_for(args.backend)
    with open(args.indices, encoding="utf-8") as handle:
        indices = [int(line) for line in handle if line.strip()]
    with open(args.progress, "a", encoding="utf-8") as progress:
        def emit(record: dict) -> None:
            progress.write(json.dumps(record) + "\n")
            progress.flush()
            os.fsync(progress.fileno())

        for index in indices:
            emit({"index": index, "event": "start"})
            outcome = replay_row(definition, rows[index], backend=args.backend, device=device_for(args.backend),
                                 timer=timer, repeat_count=args.repeat_count, warmup_count=args.warmup_count,
                                 memory_budget_bytes=args.memory_budget_bytes, format_cast=format_cast,
                                 path=args.rows, line=index + 2, seed=args.seed + index)
            emit({"index": index, "event": "done", "outcome": outcome.to_json()})
    return 0


def format_cast_for(backend: str):
    """The back end's storage-format cast for `replay_row` (npu: torch_npu's), None where tensors stay ND."""
    if backend != "npu":
        return None
    import torch_npu  # noqa: F401  (registers the npu device)
    return _npu_format_cast


def _npu_format_cast(tensor, fmt: str):
    """ND → the row's storage format on the NPU (FRACTAL_NZ is ACL format 29)."""
    import torch_npu

    acl_formats = {"FRACTAL_NZ": 29, "NC1HWC0": 3, "FRACTAL_Z": 4}
    if fmt not in acl_formats:
        return tensor
    return torch_npu.npu_format_cast(tensor, acl_formats[fmt])


if __name__ == "__main__":
    sys.exit(main())
