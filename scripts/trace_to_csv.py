#!/usr/bin/env python
"""Convert a torch.profiler Chrome trace (CPU or CUDA, record_shapes=True) into a kernel_details-like CSV.

One row per op call the parse stage would use (innermost compute op on CPU; op that launched device
kernels on CUDA, with their summed device time), with Input Shapes/Data Types/Formats, inferred Output
Shapes/Data Types, and Input Scalars. The CSV can be inspected by hand or given to parse_kernel_details.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="exit codes: 0 ok, 2 bad input (one line on stderr)")
    parser.add_argument("--trace", required=True, type=Path, help="torch.profiler Chrome trace (.json)")
    parser.add_argument("--output", required=True, type=Path, help="CSV to write (atomically)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.parse.torch_trace import trace_to_csv

    rows = trace_to_csv(args.trace, args.output)
    print(f"wrote {rows} op rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
