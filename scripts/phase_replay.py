#!/usr/bin/env python
"""Stage 4b: replay the workload's calls in its own order (docs/replay.md, "Phase replay").

One at a time, a row replays in the cache state its policy approximates and the power state a heater
approximates; inside the workload its calls ran in the state the calls before them left, and no policy reproduced
that for every row (a dense prefill under NVML's sw_power_cap ran its memory-bound rows 5-15 % slower; short rows
of throttled decode steps 4-6 % slower). This stage replays every call of each torch.profiler trace of the database
in the trace's order, back to back, --iterations times. It rebuilds each distinct row's call from the replayed rows
(the same definitions, schema recipes and checks as scripts/replay.py), on cuda rewrites each call's warm inputs into
L2 before it (as the insitu cache state would, with no flush; without them dense's rows under 3 us replayed at 1.25x,
benchmarks/results/whole_order/), and times every call (CUPTI kernel time on cuda, the op's profiler time on cpu).
Every row takes its in-order mean, whatever its length (benchmarks/results/whole_order/: with every row in order dense
came to 1.7 / 6.8 / 0.4 %, against 2.6 / 10.9 / 0.5 % with rows from 20 us only). It writes a table, one line
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
from opperf.replay.phase import PHASE_ITERATIONS  # noqa: E402


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
    parser.add_argument("--cold-copies", action=argparse.BooleanOptionalAction, default=False,
                        help="cuda: a row that comes back before the cache turns over takes turns over copies of its "
                             "cold inputs, as the workload ran one shape on several weights (default: off; "
                             "benchmarks/results/whole_order/, qwen2_close_copies: Qwen2-MoE, unseen, addmm median gap "
                             "7.2 -> 0.8 %%, the workload 2.0 / 8.9 / 0.8 %%; not yet run on dense or Mixtral)")
    parser.add_argument("--iterations", type=int, default=PHASE_ITERATIONS,
                        help="times the trace is replayed, each after 0.2 s of idle (a row's mean is over all; default: "
                             "%(default)s; benchmarks/results/whole_order/: two replays 1.2-1.5 %% apart at the median "
                             "with 1, 0.6 %% with 3)")
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
        found_here = select_phases(trace)
        for phase in found_here:
            phases.append(phase)
            keys.append(call_keys(phase, rows, ", ".join(map(str, args.rows))))
        print(f"{trace}: {len(found_here)} phase(s) the whole trace, {sum(map(len, found_here))} calls", flush=True)
    if not phases:
        print("no phase to replay: every row keeps its one-at-a-time replay", flush=True)
        table = phase_table([], [], None)
    else:
        calls = sum(len(k) for k in keys)
        profiled_ms = sum(float(call[DURATION]) for phase in phases for call in phase) / 1000
        print(f"replaying {len(phases)} phase(s): {calls} calls of {len({k for ks in keys for k in ks})} rows, "
              f"{profiled_ms:.1f} ms of profiled device time, on {args.device}", flush=True)
        times = replay_phases(keys, rows, device=args.device, iterations=args.iterations, cold_copies=args.cold_copies)
        for key, reason in times.left_out.items():
            row = rows[key]
            print(f"left out of the order: {row['_path']}, line {row['_line']} ({key[0]} {key[1]}): {reason}",
                  flush=True)
        if not times.measured:
            raise OpperfError(f"nothing was measured in {len(phases)} phase(s) (on cuda the timer counts device "
                              f"kernels: replay on the GPU the profile was taken on)", field="--device")
        table = phase_table(phases, keys, times)
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
