"""The program an NPU replay job profiles: `python -m opperf.replay.npu.entry --execution-mode MODE WORKER-ARGS`.

`inprocess` (the default, as the seed's run_all_op): the replay worker runs in this very process,
so the msprof session around it profiles it directly. `subprocess`: the worker runs as a child of
this process (msprof follows the device, so its tasks are still in the session), for CANN versions
whose profiler must not share a process with an aborting kernel. `--profiler torch_npu` is the
alternative timer: no msprof around the process, the worker runs inside `torch_npu.profiler.profile`
(level 1, PipeUtilization counters), which writes `ASCEND_PROFILER_OUTPUT/kernel_details.csv` under
`--profiler-output`. Under torchrun (DispatchFFNCombine) every rank replays the same rows, and only
rank 0 reports progress to the parent, so each row is reported once.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from opperf.replay.npu.msprof import EXECUTION_MODES, PROFILERS


def _rank_local_arguments(worker_args: list[str]) -> list[str]:
    """Worker arguments for this torchrun rank: ranks other than 0 report to a file of their own."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0 or "--progress" not in worker_args:
        return worker_args
    arguments = list(worker_args)
    position = arguments.index("--progress") + 1
    arguments[position] = f"{arguments[position]}.rank{rank}"
    return arguments


def _bind_rank_device(local_rank: int) -> None:
    """Under torchrun each local rank replays on its own NPU (rank i -> the i-th visible device)."""
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    torch.npu.set_device(local_rank)


def _run_under_torch_npu_profiler(run, output_dir: str) -> int:
    """Run `run()` inside torch_npu.profiler (NPU activity, level 1: kernel_details with shapes and counters)."""
    import torch_npu

    profiler = torch_npu.profiler
    config = profiler._ExperimentalConfig(profiler_level=profiler.ProfilerLevel.Level1,
                                          aic_metrics=profiler.AiCMetrics.PipeUtilization)
    with profiler.profile(activities=[profiler.ProfilerActivity.NPU], record_shapes=True,
                          on_trace_ready=profiler.tensorboard_trace_handler(output_dir),
                          experimental_config=config):
        return run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execution-mode", choices=EXECUTION_MODES, default="inprocess",
                        help="run the replay worker in this process (inprocess) or as its child (subprocess)")
    parser.add_argument("--profiler", choices=PROFILERS, default="msprof",
                        help="msprof: a session wraps this process; torch_npu: profile in-process")
    parser.add_argument("--profiler-output", help="torch_npu: the directory the profiler writes to")
    args, worker_args = parser.parse_known_args(argv)
    worker_args = _rank_local_arguments(worker_args)
    if args.profiler == "torch_npu" and not args.profiler_output:
        parser.error("--profiler torch_npu needs --profiler-output DIR")
    if args.execution_mode == "subprocess" and "LOCAL_RANK" in os.environ:
        parser.error("under torchrun (DispatchFFNCombine) use --execution-mode inprocess: each rank binds its NPU")
    if args.execution_mode == "subprocess":
        def run() -> int:
            return subprocess.call([sys.executable, "-m", "opperf.replay.worker", *worker_args])
    else:
        def run() -> int:
            from opperf.replay import worker
            if "LOCAL_RANK" in os.environ:
                _bind_rank_device(int(os.environ["LOCAL_RANK"]))
            return worker.main(worker_args)
    if args.profiler == "torch_npu":
        return _run_under_torch_npu_profiler(run, args.profiler_output)
    return run()


if __name__ == "__main__":
    sys.exit(main())
