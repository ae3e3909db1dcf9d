#!/usr/bin/env python
"""Stage 5: write the final database files (per-kernel CSV, op_mapping.yaml, manifest)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.database.build import (  # noqa: E402
    MSMODELING_DEVICE_FILE,
    build_database_directory,
    build_op_mapping,
    finalise_kernel_csv,
    write_manifest,
    write_msmodeling_device,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Write the final database files of one database directory.")
    sub = parser.add_subparsers(dest="command", required=True)
    kernel = sub.add_parser("kernel", help="check a kernel type's rows and write {KernelType}.csv in contract order")
    kernel.add_argument("--rows", required=True, help="the last stage's CSV for this kernel type")
    kernel.add_argument("--kernel", required=True, help="kernel type (the CSV's name)")
    kernel.add_argument("--output", required=True, help="data/{device}/{stack}/{version_dir}/{KernelType}.csv")
    kernel.add_argument("--layouts", help="where every row goes (default: layouts/{KernelType}.csv beside --output)")
    kernel.add_argument("--backend", default="npu", choices=("npu", "cuda", "cpu"),
                        help="the database's back end: cpu and cuda databases are written in the runtime's "
                             "dtype spellings")
    kernel.add_argument("--definition", default="",
                        help="the kernel type's definition file, if any (its out= slots and query mode)")
    kernel.add_argument("--phase", default="",
                        help="the phase stage's table (scripts/phase_replay.py), folded into the rows first")
    mapping = sub.add_parser("op-mapping", help="generate op_mapping.yaml from the kernel definitions")
    mapping.add_argument("--kernels", nargs="+", required=True,
                         help="the database's kernel CSVs (data/{device}/{stack}/{version_dir}/*.csv)")
    mapping.add_argument("--device", required=True, help="key of the device catalog")
    mapping.add_argument("--devices", default="config/devices.yaml")
    mapping.add_argument("--definitions", default="config/kernels", help="kernel definitions root")
    mapping.add_argument("--output", required=True, help="data/{device}/{stack}/{version_dir}/op_mapping.yaml")
    mapping.add_argument("--consumer-queries", default="",
                         help="the grid's consumer_queries.json (who recorded the consumer's queries: msmodeling's "
                              "runner and its commit, or opperf's), kept as op_mapping.yaml's opperf.consumer_queries")
    device = sub.add_parser("msmodeling-device", help="write the DeviceProfile file msmodeling's CLI loads for the "
                                                      "database's device (msmodeling_device.py, docs/msmodeling.md)")
    device.add_argument("--device", required=True, help="key of the device catalog")
    device.add_argument("--devices", default="config/devices.yaml")
    device.add_argument("--output", required=True, help="data/{device}/{stack}/{version_dir}/msmodeling_device.py")
    directory = sub.add_parser("directory", help="build a whole database from a directory of replayed rows "
                                                 "(a replay run by hand or by a benchmark)")
    directory.add_argument("--rows-dir", required=True, help="one {KernelType}.csv per kernel type")
    directory.add_argument("--device", required=True, help="key of the device catalog")
    directory.add_argument("--devices", default="config/devices.yaml")
    directory.add_argument("--definitions", default="config/kernels", help="kernel definitions root")
    directory.add_argument("--output", required=True,
                           help="the database directory, data/{device}/{stack}/{version_dir} (its name is the "
                                "version directory op_mapping.yaml records); built beside it, then renamed into "
                                "place. A directory that holds files already is refused without --overwrite")
    directory.add_argument("--overwrite", action="store_true",
                           help="replace the database --output holds: printed, kernel type by kernel type; the CSVs "
                                "and layouts files of kernel types the new build lacks are removed with it")
    manifest = sub.add_parser("manifest", help="list a database's files with row counts")
    manifest.add_argument("--files", nargs="+", required=True)
    manifest.add_argument("--output", required=True)
    for p in (kernel, mapping, device, directory, manifest):
        add_logging_args(p)
    return parser


def _check_device_file_name(output: str) -> None:
    from opperf.errors import OpperfError

    if Path(output).name != MSMODELING_DEVICE_FILE:
        raise OpperfError(f"must be named {MSMODELING_DEVICE_FILE} (the file msmodeling's launcher loads)",
                          path=output, field="--output")


def main(args: argparse.Namespace) -> int:
    if args.command == "kernel":
        finalise_kernel_csv(args.rows, args.kernel, args.output, backend=args.backend,
                            definition_path=args.definition or None, layouts=args.layouts,
                            phase_table=args.phase or None)
    elif args.command == "op-mapping":
        from opperf.consumer.recorder import read_consumer_record

        record = read_consumer_record(args.consumer_queries) if args.consumer_queries else None
        build_op_mapping(args.kernels, args.device, args.devices, args.definitions, args.output,
                         consumer_record=record)
    elif args.command == "msmodeling-device":
        _check_device_file_name(args.output)
        write_msmodeling_device(args.device, args.devices, Path(args.output).parent)
    elif args.command == "directory":
        built = build_database_directory(args.rows_dir, args.device, args.output, args.devices, args.definitions,
                                         overwrite=args.overwrite)
        if built.replaced is not None:
            print(built.replaced.summary())
    else:
        write_manifest(args.files, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
