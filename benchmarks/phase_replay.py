#!/usr/bin/env python
"""Replay a phase of a profiled workload as the workload ran it: its calls in trace order, back to back.

Row by row, replay reproduces a call's inputs, layout and cache state, and approximates the GPU's power state with a
policy (docs/replay.md, "Power state"). The dense reference decoder's 64 x 1,024-token prefill runs for hundreds of
milliseconds under NVML's `sw_power_cap`, and no policy tried reproduces its state for every row: after equal idle
its rows replay 4-15 % fast, with 0.4 s of heater GEMMs before them and none between the calls the attention block's
rows replay 8-15 % slow (benchmarks/results/power_phase/). This benchmark asks whether the workload's own sequence
does: it takes the calls of one phase from the trace (those whose input shapes start with one of --shapes, in the
first contiguous run of at least --min-calls of them; with --throttled, every power-capped phase the profile's NVML
samples show: runs of throttled calls that kept the GPU busy, opperf.replay.phase.throttled_phases), builds each
distinct row's call once from the parsed database (the same definitions, schema recipes and checks as
scripts/replay.py), runs the phases' calls in the trace's order --iterations times (default once, as the workload
did: run longer, the phase throttles further) after --warmup more and --rest-s of idle before each phase, and times
every call with the profiler (CUPTI kernel time per call, each in a range of its row, as replay's kernel timing
does). Inputs are the rows' own tensors, not the previous call's outputs; with --warm-inputs each call's warm inputs
are rewritten into L2 before it (stage 4b's default), with --cold-copies as well the calls of a row that comes back
before the cache turns over take turns over copies of its cold inputs (opperf.replay.phase.close_rows); no flush and no heaters run in between.

Per row it reports the in-phase mean against the profiled mean of the same calls and, where the database was
replayed, the row's replay against its own profiled mean; with NVML, the SM clock and power over the phase runs.

    python benchmarks/phase_replay.py --trace WORK/dense/profile/trace.json \\
        --rows WORK/dense/insitu/data/H200/torch/torch2.11.0_cuda13.0 --max-gap 40 --output OUT.json
    python benchmarks/phase_replay.py --throttled --trace ... --rows ... --output OUT.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuda_replay import POWER_LIMITED_PREFILL_SHAPES, gap_summary  # noqa: E402  (beside this script)

from opperf import contract  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402
from opperf.power_samples import POWER_SAMPLES  # noqa: E402
from opperf.replay.phase import (call_keys, database_rows, profiled_call_times, replay_phases,  # noqa: E402
                                 select_phases, trace_calls)


def phases_to_replay(args) -> list[list[dict]]:
    """The phases to replay: the first run of --shapes (the whole trace with no shapes), or with --throttled every
    power-capped phase the profile's NVML samples show, as stage 4b finds them (opperf.replay.phase.select_phases)."""
    if not args.throttled and not args.shapes:
        return [trace_calls(args.trace)]
    phases = select_phases(args.trace, shapes=[] if args.throttled else args.shapes, min_calls=args.min_calls,
                           max_gap=args.max_gap, min_phase_ms=args.min_phase_ms)
    if not phases:
        raise OpperfError(f"no power-capped phase of {args.min_phase_ms} ms or more (the trace needs NVML's samples "
                          f"beside it: {POWER_SAMPLES})", field="--throttled")
    return phases[:args.max_phases] if args.max_phases else phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="the profile's trace.json")
    parser.add_argument("--rows", type=Path, required=True, help="the parsed or replayed database directory")
    parser.add_argument("--shapes", nargs="*", default=list(POWER_LIMITED_PREFILL_SHAPES),
                        help="input-shape prefixes of the phase's calls (none: the whole trace)")
    parser.add_argument("--min-calls", type=int, default=20)
    parser.add_argument("--max-gap", type=int, default=3, help="other calls allowed between two of the phase's")
    parser.add_argument("--throttled", action="store_true",
                        help="replay every power-capped phase of the profile (NVML's samples), not --shapes")
    parser.add_argument("--min-phase-ms", type=float, default=20.0, help="--throttled: shortest phase (device ms)")
    parser.add_argument("--max-phases", type=int, default=0, help="--throttled: the first N phases only (0: all)")
    parser.add_argument("--rest-s", type=float, default=0.2, help="idle before each phase")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--warm-inputs", action="store_true",
                        help="before each call, rewrite the inputs insitu keeps warm into L2 (no flush)")
    parser.add_argument("--cold-copies", action="store_true",
                        help="with --warm-inputs: a row that comes back before the cache turns over takes turns over "
                             "copies of its cold inputs")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()

    try:
        phases = phases_to_replay(args)
        rows = database_rows(args.rows)
        phase_keys = [call_keys(phase, rows, args.rows) for phase in phases]
    except OpperfError as exc:
        raise SystemExit(f"{args.trace}: {exc}") from exc
    keys = [key for ks in phase_keys for key in ks]
    profiled_calls = profiled_call_times(phases, phase_keys)
    print(f"{len(phases)} phase(s): {len(keys)} calls of {len(set(keys))} rows, "
          f"{sum(sum(v) for v in profiled_calls.values()) / 1000:.1f} ms of profiled device time", flush=True)
    from opperf.workload.power import NvmlSampler

    sampler = NvmlSampler.start_if_available(0) if args.device.startswith("cuda") else None
    try:
        times = replay_phases(phase_keys, rows, device=args.device, iterations=args.iterations, warmup=args.warmup,
                              rest_s=args.rest_s, warm_inputs=args.warm_inputs, cold_copies=args.cold_copies)
    except OpperfError as exc:
        raise SystemExit(str(exc)) from exc
    finally:
        if sampler:
            sampler.stop()
    state = sampler.state_during(times.started_us, times.ended_us) if sampler else None
    counts = Counter(keys)
    if not times.measured:
        raise SystemExit("no time was measured in the phase (on cuda the timer counts device kernels: run it on the "
                         "GPU the profile was taken on)")
    table, total_profiled, total_phase, total_replay = [], 0.0, 0.0, 0.0
    for key, samples in times.samples.items():
        row = rows[key]
        profiled = statistics.fmean(profiled_calls[key])
        row_mean = float(row[contract.PROFILING_AVERAGE])
        replayed = row.get(contract.REPLAY_MEDIAN) or ""
        phase = statistics.fmean(samples)
        entry = {"type": key[0], "input_shapes": key[1], "key": list(key), "line": row["_line"],
                 "calls_in_phase": counts[key], "profiled_us": profiled, "row_profiled_us": row_mean,
                 "row_calls": int(float(row.get(contract.PROFILING_SAMPLE_COUNT) or 0)),
                 "phase_us": phase, "phase_ratio": phase / profiled,
                 "replay_ratio": float(replayed) / row_mean if replayed else None,
                 "profiled_sm_mhz": float(row[contract.PROFILED_SM_CLOCK]) if row.get(contract.PROFILED_SM_CLOCK)
                 else None}
        table.append(entry)
        weight = counts[key]
        total_profiled += profiled * weight
        total_phase += phase * weight
        total_replay += float(replayed) / row_mean * profiled * weight if replayed else profiled * weight
    table.sort(key=lambda e: -e["profiled_us"] * e["calls_in_phase"])
    print("\n| row | calls | profiled µs (these calls) | in phase | x profiled | isolated replay x row's profiled |")
    print("|---|---|---|---|---|---|")
    for e in table:
        replay = f"{e['replay_ratio']:.3f}" if e["replay_ratio"] else "-"
        print(f"| {e['type']} {e['input_shapes'][:40]} | {e['calls_in_phase']} | {e['profiled_us']:.1f} | "
              f"{e['phase_us']:.1f} | {e['phase_ratio']:.3f} | {replay} |")
    gaps = gap_summary([(e["phase_us"], e["profiled_us"], e["calls_in_phase"]) for e in table])
    summary = {"phases": len(phases), "rows": len(table), "calls": len(keys),
               "phase_time_ratio": total_phase / total_profiled, "replay_time_ratio": total_replay / total_profiled,
               "median_gap": gaps["median_gap"], "time_weighted_gap": gaps["time_weighted_gap"],
               "sm_mhz": state[0] if state else None, "power_w": state[1] if state else None}
    print(f"\nphase time / profiled {summary['phase_time_ratio']:.3f} (isolated replay "
          f"{summary['replay_time_ratio']:.3f}); median gap {summary['median_gap']:.1%}, time-weighted "
          f"{summary['time_weighted_gap']:.1%}; SM clock {summary['sm_mhz']} MHz, {summary['power_w']} W", flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "method": times.method,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "trace": str(args.trace), "rows": str(args.rows), "selection": "throttled" if args.throttled else
        {"shapes": args.shapes, "min_calls": args.min_calls, "max_gap": args.max_gap},
        "iterations": args.iterations, "warmup": args.warmup, "rest_s": args.rest_s,
        "warm_inputs": args.warm_inputs, "cold_copies": args.cold_copies, "summary": summary,
        "table": table}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
