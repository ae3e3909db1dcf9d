#!/usr/bin/env python
"""Stage 4b: replay the workload's calls in its own order (docs/replay.md, "Phase replay").

One at a time, a row replays in the cache state its policy approximates and the power state a heater
approximates; inside the workload its calls ran in the state the calls before them left, and no policy reproduced
that for every row (a dense prefill under NVML's sw_power_cap ran its memory-bound rows 5-15 % slower; short rows
of throttled decode steps 4-6 % slower). This stage replays every call of each torch.profiler trace of the database
in the trace's order, back to back, --iterations times (--scope trace, the default), or only its power-capped phases
(--scope throttled, from the NVML samples the workload stage wrote beside it; --shapes selects by input-shape
prefixes). It rebuilds each distinct row's call from the replayed rows (the same definitions, schema recipes and
checks as scripts/replay.py), rewrites each call's warm inputs into L2 before it (as the insitu cache policy would, with no
flush), and times every call (CUPTI kernel time on cuda, the op's profiler time on cpu). It writes a table, one line
per row, that the database stage folds into the rows (build_database.py kernel --phase): `Average Duration(us)`
becomes the call-weighted blend of the in-order mean and the one-at-a-time replay (the in-order mean alone when
every call of the row was replayed in order).

Rows whose one-at-a-time replay failed, or which cannot be built, are left out of the order and named. Nothing
measured is an error: the run is on the wrong device, the timer saw no kernels, or no row could be built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.replay.phase import PHASE_ITERATIONS, PHASE_MIN_DEVICE_MS, PHASE_SCOPES  # noqa: E402
from opperf.replay.phase_table import PHASE_MIN_ROW_US  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="exit codes: 0 ok (an empty table when no phase was found), 2 bad input "
                                            "or nothing measured (one line on stderr)")
    parser.add_argument("--profiling-path", nargs="+", required=True,
                        help="the database's profiles, as the parse was given them (torch.profiler traces or "
                             "directories holding them; NVML's power_samples.json beside each)")
    parser.add_argument("--rows", nargs="+", required=True,
                        help="the replayed kernel CSVs (files or database directories) the phases' calls map to")
    parser.add_argument("--output", required=True, type=Path, help="the phase table (CSV, written atomically)")
    parser.add_argument("--scope", choices=PHASE_SCOPES, default="trace",
                        help="what is replayed in order: every call of each trace, or only its power-capped phases "
                             "(from the NVML samples beside it)")
    parser.add_argument("--shapes", nargs="*", default=[],
                        help="instead of --scope: the first run of calls whose input shapes start with one of these "
                             "prefixes (e.g. '64,1024,'), per trace")
    parser.add_argument("--min-calls", type=int, default=20, help="--shapes: the shortest run taken")
    parser.add_argument("--max-gap", type=int, default=3, help="--shapes: other calls allowed between two of the run's")
    parser.add_argument("--min-phase-ms", type=float, default=PHASE_MIN_DEVICE_MS,
                        help="the shortest power-capped phase replayed (device ms)")
    parser.add_argument("--min-row-us", type=float, default=PHASE_MIN_ROW_US,
                        help="rows whose in-phase calls averaged less keep their one-at-a-time replay")
    parser.add_argument("--warm-inputs", action=argparse.BooleanOptionalAction, default=True,
                        help="cuda: rewrite each call's warm inputs into L2 before it (insitu, no flush)")
    parser.add_argument("--cold-copies", action=argparse.BooleanOptionalAction, default=False,
                        help="cuda, with --warm-inputs: a row that comes back before the cache turns over takes turns "
                             "over copies of its cold inputs (as the workload ran one shape on several weights)")
    parser.add_argument("--iterations", type=int, default=PHASE_ITERATIONS,
                        help="times the phases are replayed, each after --rest-s of idle (a row's mean is over all)")
    parser.add_argument("--rest-s", type=float, default=0.2, help="idle before each phase (s)")
    parser.add_argument("--device", default="cuda", help="torch device to replay on (cuda, cuda:1, cpu)")
    parser.add_argument("--apply-to", type=Path,
                        help="also fold the table into the kernel CSVs of this directory, in place (a replay run by "
                             "hand or by a benchmark; the workflow folds it in its database stage)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.errors import OpperfError
    from opperf.io import write_csv_atomic
    from opperf.parse.discover import discover_inputs
    from opperf.parse.kernel_details import DURATION
    from opperf.power_samples import POWER_SAMPLES
    from opperf.replay.phase import call_keys, database_rows, phase_table, replay_phases, select_phases
    from opperf.replay.phase_table import applied_time_ratio, apply_phase_table

    if args.iterations < 1:     # before the traces are read: converting one takes seconds
        raise OpperfError(f"--iterations {args.iterations}: replay the phases at least once", field="--iterations")
    found = discover_inputs(args.profiling_path)
    if found.tables:
        raise OpperfError("phase replay follows a torch.profiler trace's call order; this profile is a kernel table "
                          "(an NPU bundle or msprof export) with no power samples to find phases by",
                          path=found.tables[0], field="--profiling-path")
    rows = database_rows(args.rows)
    phases, keys = [], []
    for trace in found.torch_traces:
        found_here = select_phases(trace, scope=args.scope, shapes=args.shapes, min_calls=args.min_calls,
                                   max_gap=args.max_gap, min_phase_ms=args.min_phase_ms)
        for phase in found_here:
            phases.append(phase)
            keys.append(call_keys(phase, rows, ", ".join(map(str, args.rows))))
        if found_here or args.shapes or args.scope == "trace":
            how = ("selected by --shapes" if args.shapes else "power-capped, from its NVML samples"
                   if args.scope == "throttled" else "the whole trace")
            print(f"{trace}: {len(found_here)} phase(s) {how}, {sum(map(len, found_here))} calls", flush=True)
        elif (trace.parent / POWER_SAMPLES).exists():
            print(f"{trace}: no power-capped phase of {args.min_phase_ms:g} ms or more in its NVML samples",
                  flush=True)
        else:
            print(f"{trace}: no NVML samples beside it ({POWER_SAMPLES}), so no phase to find", flush=True)
    if not phases:
        print("no phase to replay: every row keeps its one-at-a-time replay", flush=True)
        table = phase_table([], [], None, args.min_row_us)
    else:
        calls = sum(len(k) for k in keys)
        profiled_ms = sum(float(call[DURATION]) for phase in phases for call in phase) / 1000
        print(f"replaying {len(phases)} phase(s): {calls} calls of {len({k for ks in keys for k in ks})} rows, "
              f"{profiled_ms:.1f} ms of profiled device time, on {args.device}", flush=True)
        times = replay_phases(keys, rows, device=args.device, iterations=args.iterations, rest_s=args.rest_s,
                              warm_inputs=args.warm_inputs, cold_copies=args.cold_copies)
        for key, reason in times.left_out.items():
            row = rows[key]
            print(f"left out of the order: {row['_path']}, line {row['_line']} ({key[0]} {key[1]}): {reason}",
                  flush=True)
        if not times.measured:
            raise OpperfError(f"nothing was measured in {len(phases)} phase(s) (on cuda the timer counts device "
                              f"kernels: replay on the GPU the profile was taken on)", field="--device")
        table = phase_table(phases, keys, times, args.min_row_us)
        applied, ratio = applied_time_ratio(table)
        print(f"{applied} of {len(table)} rows applied; their calls replayed in phase at "
              f"{ratio if ratio is not None else float('nan'):.3f}x their profiled time", flush=True)
    write_csv_atomic(args.output, table)
    if args.apply_to is not None:
        from opperf.io import read_database_csv

        for path in sorted(args.apply_to.glob("*.csv")):
            frame, changed = apply_phase_table(read_database_csv(path), path.stem, table)
            if changed:
                write_csv_atomic(path, frame)
                print(f"{path}: {changed} row(s) folded in", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
