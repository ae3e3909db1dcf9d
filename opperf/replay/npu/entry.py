"""The program one msprof session runs: `python -m opperf.replay.npu.entry --execution-mode MODE WORKER-ARGS`.

`inprocess` (the default, as the seed's run_all_op): the replay worker runs in this very process,
so the msprof session profiles it directly. `subprocess`: the worker runs as a child of this process
(msprof follows the device, so its tasks are still in the session), for CANN versions whose
profiler must not share a process with an aborting kernel. Under torchrun (DispatchFFNCombine) every
rank replays the same rows, and only rank 0 reports progress to the parent, so each row is reported
once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from opperf.replay.npu.msprof import EXECUTION_MODES


def _rank_local_arguments(worker_args: list[str]) -> list[str]:
    """Worker arguments for this torchrun rank: ranks other than 0 report to a file of their own."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 or "--progress" not in worker_args:
        return worker_args
    arguments = list(worker_args)
    position = arguments.index("--progress") + 1
    arguments[position] = f"{arguments[position]}.rank{rank}"
    return arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execution-mode", choices=EXECUTION_MODES, default="inprocess",
                        help="run the replay worker in this process (inprocess) or as its child (subprocess)")
    args, worker_args = parser.parse_known_args(argv)
    worker_args = _rank_local_arguments(worker_args)
    if args.execution_mode == "subprocess":
        return subprocess.call([sys.executable, "-m", "opperf.replay.worker", *worker_args])
    from opperf.replay import worker
    return worker.main(worker_args)


if __name__ == "__main__":
    sys.exit(main())
