#!/usr/bin/env python
"""Print this host's version directories as config YAML, for planning on a host that cannot read them.

A SLURM login node has no GPU or CANN, so it cannot tell which torch/CUDA/NCCL/CANN the device nodes run.
Run this once on a device node and paste its output into your config file (docs/cluster.md):

    srun --gpus=1 python scripts/print_version_dirs.py --backend cuda --comm nccl
    workload: {version_dir: torch2.11.0_cuda13.0}
    comm: {version_dir: nccl2.28.9_torch2.11.0_cuda13.0}
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["cpu", "cuda", "npu"], required=True,
                        help="the workload's back end (config workload.backend)")
    parser.add_argument("--comm", choices=["gloo", "nccl", "hccl"],
                        help="the collectives' back end (config comm.backend); omit to print no comm line")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.comm.collectives import comm_version_dir
    from opperf.versions import workload_version_dir

    print(f"workload: {{version_dir: {workload_version_dir(args.backend)}}}")
    if args.comm:
        print(f"comm: {{version_dir: {comm_version_dir(args.comm)}}}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
