#!/usr/bin/env python
"""Replay a phase of a profiled workload as the workload ran it: its calls in trace order, back to back.

Row by row, replay reproduces a call's inputs, layout and cache state, and approximates the GPU's power state with a
policy (docs/replay.md, "Power state"). The dense reference decoder's 64 x 1,024-token prefill runs for hundreds of
milliseconds under NVML's `sw_power_cap`, and no policy tried reproduces its state for every row: after equal idle
its rows replay 4-15 % fast, with 0.4 s of heater GEMMs before them and none between the calls the attention block's
rows replay 8-15 % slow (benchmarks/results/power_phase/). This benchmark asks whether the workload's own sequence
does: it takes the calls of one phase from the trace (those whose input shapes start with one of --shapes, in the
first contiguous run of at least --min-calls of them), builds each distinct row's call once from the parsed
database (the same definitions, schema recipes and checks as scripts/replay.py), runs the phase's calls in the
trace's order --iterations times after --warmup more, and times every call with the profiler (CUPTI kernel time
per call, each in a range of its row, as replay's kernel timing does). Inputs are the rows' own tensors, not the
previous call's outputs; no cache preparation and no heaters run in between.

Per row it reports the in-phase mean against the profiled mean and, where the database was replayed, against the
row's replay; with NVML, the SM clock and power over the phase runs against the profile's.

    python benchmarks/phase_replay.py --trace WORK/dense/profile/trace.json \\
        --rows WORK/dense/insitu/data/H200/torch/torch2.11.0_cuda13.0 --output OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opperf import contract  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402
from opperf.replay.definitions import DEFAULT_DEFINITIONS_DIR  # noqa: E402
from opperf.replay.engine import PreparedRow, prepare_row  # noqa: E402
from opperf.replay.job import find_definition, recipe_for  # noqa: E402
from opperf.replay.phase import call_keys, database_rows, phase_calls, trace_calls  # noqa: E402
from opperf.replay.timing import RangeSession, range_device_times  # noqa: E402

# The dense decoder's 64 x 1,024-token prefill (benchmarks/cuda_replay.py, in_power_limited_phase).
DENSE_PREFILL_SHAPES = ("65536,", "64,1024,", "64,64,1024,", "64,8,8,1024,")


class _Synchronizer:
    """What prepare_row needs of a timer: waiting for the device."""

    def __init__(self, backend: str):
        self.backend = backend

    def synchronize(self) -> None:
        if self.backend == "cuda":
            torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="the profile's trace.json")
    parser.add_argument("--rows", type=Path, required=True, help="the parsed or replayed database directory")
    parser.add_argument("--shapes", nargs="*", default=list(DENSE_PREFILL_SHAPES),
                        help="input-shape prefixes of the phase's calls (none: the whole trace)")
    parser.add_argument("--min-calls", type=int, default=20)
    parser.add_argument("--max-gap", type=int, default=3, help="other calls allowed between two of the phase's")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    try:
        calls = phase_calls(trace_calls(args.trace), args.shapes, args.min_calls, args.max_gap)
        rows = database_rows(args.rows)
        keys = call_keys(calls, rows, args.rows)
    except OpperfError as exc:
        raise SystemExit(f"{args.trace}: {exc}") from exc
    print(f"phase: {len(calls)} calls of {len(set(keys))} rows, "
          f"{(float(calls[-1]['Start Time(us)']) - float(calls[0]['Start Time(us)'])) / 1000:.1f} ms in the trace",
          flush=True)
    backend = "cuda" if args.device.startswith("cuda") else "cpu"
    device = _Synchronizer(backend)
    prepared: dict[tuple, PreparedRow] = {}
    for key in dict.fromkeys(keys):
        row = rows[key]
        definition = recipe_for(key[0], backend, find_definition(key[0], backend, DEFAULT_DEFINITIONS_DIR))
        outcome = prepare_row(definition, row, backend=backend, device=args.device, timer=device,
                              path=row["_path"], line=row["_line"]) if definition else None
        if not isinstance(outcome, PreparedRow):
            raise SystemExit(f"{row['_path']}:{row['_line']}: {key[0]} cannot be built "
                             f"({getattr(outcome, 'status', 'no definition')}: {getattr(outcome, 'error', '')})")
        prepared[key] = outcome
    from opperf.workload.power import NvmlSampler

    sampler = NvmlSampler.start_if_available(0) if backend == "cuda" else None
    from torch.profiler import ProfilerActivity, record_function

    session = RangeSession([ProfilerActivity.CPU, ProfilerActivity.CUDA] if backend == "cuda"
                           else [ProfilerActivity.CPU], strict=True)
    counts = {key: keys.count(key) for key in prepared}
    for _ in range(args.warmup):
        for key in keys:
            prepared[key].case.run()
    device.synchronize()
    names = {key: session.range_name(key, counts[key] * args.iterations, "phase") for key in prepared}
    started = time.monotonic_ns() / 1000.0
    for _ in range(args.iterations):
        for key in keys:
            with record_function(names[key]):
                prepared[key].case.run()
        device.synchronize()
    ended = time.monotonic_ns() / 1000.0
    results = session.collect(range_device_times, "cuda profiler (CUPTI) device-kernel time per call, in phase")
    state = sampler.state_during(started, ended) if sampler else None
    if sampler:
        sampler.stop()

    if not any(sample > 0 for result in results.values() for sample in result.samples_us):
        raise SystemExit("no device time was measured in the phase (the timer counts device kernels: run it on the "
                         "GPU the profile was taken on)")
    table, total_profiled, total_phase, total_replay = [], 0.0, 0.0, 0.0
    for key in prepared:
        row, samples = rows[key], results[key].samples_us
        profiled = float(row[contract.PROFILING_AVERAGE])
        replayed = row.get(contract.REPLAY_MEDIAN) or ""
        phase = statistics.fmean(samples)
        entry = {"type": key[0], "input_shapes": key[1], "key": list(key), "line": row["_line"],
                 "calls_in_phase": counts[key], "profiled_us": profiled,
                 "phase_us": phase, "phase_ratio": phase / profiled,
                 "replay_ratio": float(replayed) / profiled if replayed else None,
                 "profiled_sm_mhz": float(row[contract.PROFILED_SM_CLOCK]) if row.get(contract.PROFILED_SM_CLOCK)
                 else None}
        table.append(entry)
        weight = counts[key]
        total_profiled += profiled * weight
        total_phase += phase * weight
        total_replay += float(replayed) * weight if replayed else profiled * weight
    table.sort(key=lambda e: -e["profiled_us"] * e["calls_in_phase"])
    print("\n| row | calls | profiled µs | in phase | x profiled | isolated replay x profiled |")
    print("|---|---|---|---|---|---|")
    for e in table:
        replay = f"{e['replay_ratio']:.3f}" if e["replay_ratio"] else "-"
        print(f"| {e['type']} {e['input_shapes'][:40]} | {e['calls_in_phase']} | {e['profiled_us']:.1f} | "
              f"{e['phase_us']:.1f} | {e['phase_ratio']:.3f} | {replay} |")
    gaps = [abs(e["phase_ratio"] - 1) for e in table]
    summary = {"rows": len(table), "calls": len(keys), "phase_time_ratio": total_phase / total_profiled,
               "replay_time_ratio": total_replay / total_profiled,
               "median_gap": statistics.median(gaps),
               "time_weighted_gap": sum(abs(e["phase_us"] - e["profiled_us"]) * e["calls_in_phase"] for e in table)
               / total_profiled,
               "sm_mhz": state[0] if state else None, "power_w": state[1] if state else None}
    print(f"\nphase time / profiled {summary['phase_time_ratio']:.3f} (isolated replay "
          f"{summary['replay_time_ratio']:.3f}); median gap {summary['median_gap']:.1%}, time-weighted "
          f"{summary['time_weighted_gap']:.1%}; SM clock {summary['sm_mhz']} MHz, {summary['power_w']} W", flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "device": torch.cuda.get_device_name() if backend == "cuda" else "cpu", "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trace": str(args.trace), "rows": str(args.rows), "shapes": args.shapes, "iterations": args.iterations,
        "warmup": args.warmup, "max_gap": args.max_gap, "summary": summary, "table": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
