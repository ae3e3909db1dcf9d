"""The replay child process: replays the listed rows of one kernel type, reporting each as it goes.

Run by `opperf.replay.isolation` (never by hand: use scripts/replay.py). Each row is announced
before it starts (`start`), again when its calls have run (`measured`: nothing of it runs on the
device any more), and its outcome is appended once its samples are in (`done`), one JSON object per
line, flushed, so the parent knows which row was running if this process aborts, hangs or is killed
for memory. A batching timer (cuda kernel time) gives samples for a batch of rows at once, so `done`
may come rows after `measured`; a crash in between re-runs those rows, it blames none of them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from opperf.io import read_database_csv
from opperf.replay.methods import (DEFAULT_HEATER_MIN_POWER_W, DEFAULT_MIN_REPEAT_COUNT, TIMING_BATCH_ROWS,
                                   RepeatBudget)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", required=True)
    parser.add_argument("--kernel", required=True)
    parser.add_argument("--definition", required=True, help="a definition file, or schema:<ns>::<op>")
    parser.add_argument("--backend", required=True, choices=["cpu", "cuda", "npu"])
    parser.add_argument("--indices", required=True, help="file with one 0-based row index per line")
    parser.add_argument("--progress", required=True, help="JSON-lines progress file to append to")
    parser.add_argument("--repeat-count", type=int, required=True)
    parser.add_argument("--warmup-count", type=int, required=True)
    parser.add_argument("--time-budget-s", type=float, default=None)
    parser.add_argument("--min-repeat-count", type=int, default=DEFAULT_MIN_REPEAT_COUNT)
    parser.add_argument("--memory-budget-bytes", type=int, default=None)
    parser.add_argument("--heater-min-power", type=float, default=DEFAULT_HEATER_MIN_POWER_W)
    parser.add_argument("--unprofiled-power", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-threads", type=int, default=None)
    return parser


def main(argv=None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    # Imports after argument parsing: a bad command line fails fast, before torch loads.
    from opperf.errors import OpperfError
    from opperf.replay.definitions import load_recipe
    from opperf.replay.engine import RowOutcome, measure_prepared, prepare_row
    from opperf.replay.inputs import check_definition_resolves
    from opperf.replay.timing import device_for, make_timer

    imported = time.perf_counter()
    frame = read_database_csv(args.rows)
    rows = frame.to_dict(orient="records")
    definition = load_recipe(args.definition, args.kernel)
    try:
        if not definition.schema_op:     # a file someone wrote (an op's own schema is not a definition to fix)
            check_definition_resolves(definition)
    except OpperfError as exc:       # the job's error, not a row's: reported once, no row is run
        with open(args.progress, "a", encoding="utf-8") as progress:
            progress.write(json.dumps({"event": "definition_error", "message": exc.reason, "field": exc.field,
                                       "line": exc.row}) + "\n")
        return 0
    timer = make_timer(args.backend, heater_min_power_w=args.heater_min_power,
                       unprofiled_power_w=args.unprofiled_power, cpu_threads=args.cpu_threads)
    try:
        format_cast = format_cast_for(args.backend)
        budget = (None if args.time_budget_s is None else
                  RepeatBudget(args.time_budget_s, args.min_repeat_count))
        ready = time.perf_counter()
        collect_s = 0.0
        with open(args.indices, encoding="utf-8") as handle:
            indices = [int(line) for line in handle if line.strip()]
        with open(args.progress, "a", encoding="utf-8") as progress:
            def emit(record: dict) -> None:
                progress.write(json.dumps(record) + "\n")
                progress.flush()
                os.fsync(progress.fileno())

            pending = {}

            def collect() -> None:
                """The batch's samples; every measured row's outcome (a failed collect fails the batch's rows)."""
                nonlocal collect_s
                began = time.perf_counter()
                try:
                    timings, error = timer.collect(), ""
                except Exception as exc:   # noqa: BLE001 — recorded on every row of the batch
                    timings, error = {}, f"{type(exc).__name__}: {exc}"
                collect_s += time.perf_counter() - began
                for index, prepared in pending.items():
                    emit({"index": index, "event": "done",
                          "outcome": prepared.outcome(timings.get(index), error).to_json()})
                pending.clear()

            for index in indices:
                emit({"index": index, "event": "start"})
                prepared = prepare_row(definition, rows[index], backend=args.backend, device=device_for(args.backend),
                                       timer=timer, memory_budget_bytes=args.memory_budget_bytes,
                                       format_cast=format_cast, path=args.rows, line=index + 2, seed=args.seed + index)
                if not isinstance(prepared, RowOutcome):
                    failed = measure_prepared(prepared, timer, index, repeat_count=args.repeat_count,
                                              warmup_count=args.warmup_count, budget=budget)
                    if failed is None:
                        pending[index] = prepared
                        emit({"index": index, "event": "measured"})
                        if len(pending) >= TIMING_BATCH_ROWS:
                            collect()
                        continue
                    prepared = failed
                emit({"index": index, "event": "done", "outcome": prepared.to_json()})
            collect()
            # Where the child's time went, for the job log (the fixed cost of a job is import + setup).
            emit({"event": "stats", "import_s": round(imported - started, 3), "setup_s": round(ready - imported, 3),
                  "rows_s": round(time.perf_counter() - ready, 3), "collect_s": round(collect_s, 3),
                  "rows": len(indices)})
    finally:
        timer.close()     # a server runs many jobs: nothing of this one may keep running
    return 0


def release_device_memory() -> None:
    """Hand cached device memory back between a server's requests (another job may need the GPU next)."""
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


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


def die_with_parent() -> None:
    """A child replay process runs in its own session (so a timeout can kill its whole group); it must still end
    when its job does (a killed Snakemake, a SIGKILLed job): Linux delivers SIGKILL when the parent goes."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG
    if os.getppid() != parent:                                      # the parent left before the call
        os._exit(1)


if __name__ == "__main__":
    die_with_parent()
    sys.exit(main())
