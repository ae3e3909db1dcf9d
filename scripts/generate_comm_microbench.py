#!/usr/bin/env python
"""Collective benchmarks (stage 6): all_reduce, all_gather, reduce_scatter, all_to_all over message sizes,
device counts and topology tiers, on gloo (CPU), NCCL (CUDA) or HCCL (NPU). Launch with torchrun."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.comm.bench import BenchRequest, plan_text, run_benchmarks  # noqa: E402
from opperf.comm.collectives import OPS  # noqa: E402
from opperf.comm.sizes import DTYPES, comm_dtype, parse_bytes_grid  # noqa: E402
from opperf.comm.timing import BENCH_MODES  # noqa: E402
from opperf.devices import load_catalog, resolve_device  # noqa: E402

SEED_GRID_SHAPE = (48, 8, 2)
EXAMPLES = """
examples:
  # the plan and its launch lines (nothing runs)
  python scripts/generate_comm_microbench.py --num-devices 16 2 --grid-shape 48 8 2
  # 2-process gloo run on CPU, 1 KiB..1 MiB, all four ops
  torchrun --standalone --nproc-per-node 2 scripts/generate_comm_microbench.py --do-run \\
      --backend gloo --device CPU --num-devices 2 --bytes-grid 1KiB..1MiB --output-dir data/CPU/gloo/torch2.13.0
  # 4 GPUs, NCCL, device-kernel time from the profiler
  torchrun --standalone --nproc-per-node 4 scripts/generate_comm_microbench.py --do-run --backend nccl \\
      --device H200 --num-devices 2 4 --bench-mode kernel --output-dir out/nccl
  # A3 super-pod, HCCL, intra-pod TP=16 and die-level pairs
  torchrun --standalone --nproc-per-node 16 scripts/generate_comm_microbench.py --do-run --backend hccl \\
      --device A3 --num-devices 16 2 --output-dir data/A3/hccl/v8.5
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output-dir", type=Path,
                        help="write one CSV per collective here (hcom_allReduce_.csv … under hccl, "
                             "all_reduce.csv … under nccl/gloo)")
    parser.add_argument("--output-csv", type=Path, help="write this one CSV (exactly one --ops value)")
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="collectives (default: all four)")
    parser.add_argument("--grid-shape", type=int, nargs="+",
                        help="machine grid, outermost level first (default: --device's comm_grid_shape from "
                             "config/devices.yaml, else 48 8 2 = A3 pods x nodes x dies; A2 is 128 8)")
    parser.add_argument("--num-devices", type=int, nargs="+", default=[2],
                        help="group sizes to benchmark (default: 2)")
    parser.add_argument("--topology-tier", type=int, nargs="+",
                        help="tiers to build groups for (0 = inter-pod, 1 = intra-pod, 2 = die level on a 3-level "
                             "grid); default: the tier of ranks 0..n-1")
    parser.add_argument("--dtype", default="bfloat16", choices=[*DTYPES, *(f"torch.{d}" for d in DTYPES)],
                        metavar="{" + ",".join(DTYPES) + "}",
                        help="element type (default: bfloat16; the seed's torch.bfloat16 spelling works too)")
    parser.add_argument("--bytes-grid", nargs="+",
                        help="per-rank message sizes: bytes, sizes with units (4KiB, 1MiB) or power-of-two "
                             "ranges (1KiB..1MiB); default: the density standard's 128B..512MiB")
    parser.add_argument("--bench-mode", choices=BENCH_MODES, default="event",
                        help="event: time the caller sees (host clock on gloo, device events on CUDA/NPU); "
                             "kernel: device-kernel time from the profiler (CUDA/NPU only) (default: event)")
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl", "hccl"], default="auto",
                        help="auto: hccl with an NPU, nccl with CUDA, else gloo")
    parser.add_argument("--device", default="",
                        help="device catalog key or full name for the CSV's device column and the default grid")
    parser.add_argument("--devices", default=None, help="device catalog (default config/devices.yaml)")
    parser.add_argument("--warmup-iters", type=int, default=5, help="untimed calls per size (default 5)")
    parser.add_argument("--min-iters", type=int, default=10, help="fewest timed calls per size (default 10)")
    parser.add_argument("--max-iters", type=int, default=200, help="most timed calls per size (default 200)")
    parser.add_argument("--target-seconds", type=float, default=0.2,
                        help="timed wall time aimed at per size, within the iteration bounds (default 0.2)")
    parser.add_argument("--version-dir", help="refuse to run unless this environment's collective library "
                                              "version directory is this (the workflow passes its wildcard)")
    parser.add_argument("--do-run", action="store_true", help="run (under torchrun); without it, print the plan")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    device_key = ""
    grid_shape = args.grid_shape
    if args.device:
        device = resolve_device(args.device, None if args.devices is None else load_catalog(args.devices))
        device_key = device.name
        grid_shape = grid_shape or list(device.comm_grid_shape)
    request = BenchRequest(
        ops=args.ops, num_devices=args.num_devices, grid_shape=tuple(grid_shape or SEED_GRID_SHAPE),
        dtype=comm_dtype(args.dtype), bytes_grid=parse_bytes_grid(args.bytes_grid), bench_mode=args.bench_mode,
        backend=args.backend, topology_tiers=args.topology_tier, device=device_key,
        warmup_iters=args.warmup_iters, min_iters=args.min_iters, max_iters=args.max_iters,
        target_seconds=args.target_seconds, output_dir=args.output_dir, output_csv=args.output_csv,
        version_dir=args.version_dir)
    if not args.do_run:
        print(plan_text(request, "scripts/generate_comm_microbench.py", sys.argv[1:]))
        return 0
    run_benchmarks(request)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
