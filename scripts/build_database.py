#!/usr/bin/env python
"""Stage 5: write the final database files (per-kernel CSV, op_mapping.yaml, manifest)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.database.build import build_op_mapping, finalise_kernel_csv, write_manifest  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write the final database files of one database directory.")
    sub = parser.add_subparsers(dest="command", required=True)
    kernel = sub.add_parser("kernel", help="check a kernel type's rows and write {KernelType}.csv in contract order")
    kernel.add_argument("--rows", required=True, help="the last stage's CSV for this kernel type")
    kernel.add_argument("--kernel", required=True, help="kernel type (the CSV's name)")
    kernel.add_argument("--output", required=True)
    mapping = sub.add_parser("op-mapping", help="generate op_mapping.yaml from the kernel definitions")
    mapping.add_argument("--kernels", nargs="+", required=True,
                         help="the database's kernel CSVs (data/{device}/{stack}/{version_dir}/*.csv)")
    mapping.add_argument("--device", required=True, help="key of the device catalog")
    mapping.add_argument("--devices", default="config/devices.yaml")
    mapping.add_argument("--definitions", default="config/kernels", help="kernel definitions root")
    mapping.add_argument("--output", required=True, help="data/{device}/{stack}/{version_dir}/op_mapping.yaml")
    manifest = sub.add_parser("manifest", help="list a database's files with row counts")
    manifest.add_argument("--files", nargs="+", required=True)
    manifest.add_argument("--output", required=True)
    for p in (kernel, mapping, manifest):
        add_logging_args(p)
    return parser


def main(args: argparse.Namespace) -> int:
    if args.command == "kernel":
        finalise_kernel_csv(args.rows, args.kernel, args.output)
    elif args.command == "op-mapping":
        build_op_mapping(args.kernels, args.device, args.devices, args.definitions, args.output)
    else:
        write_manifest(args.files, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
