#!/usr/bin/env python
"""Compare collective CSVs point by point (a new collection against a reference) and report where their
durations disagree beyond a tolerance. Exit 0: every shared point agrees (or --exit-zero); 1: some disagree
(or, with --require-same-points, a point is in one side only); 2: bad input."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.comm.alignment import validate_alignment  # noqa: E402
from opperf.io import write_text_atomic  # noqa: E402

EXAMPLES = """
examples:
  python scripts/validate_comm_alignment.py --measured data/A3/hccl/v8.5 --reference ref/hccl/v8.5
  python scripts/validate_comm_alignment.py --measured new/all_reduce.csv --reference old/all_reduce.csv \\
      --tolerance 0.1 --report reports/all_reduce_alignment.csv
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, epilog=EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", required=True, type=Path,
                        help="a collective CSV, or a directory of them (e.g. data/{device}/hccl/{version})")
    parser.add_argument("--reference", required=True, type=Path,
                        help="the CSV or directory to compare against (directories: files of the same collective)")
    parser.add_argument("--tolerance", type=float, default=0.2,
                        help="a point agrees when 1/(1+t) <= measured/reference <= 1+t (default 0.2)")
    parser.add_argument("--column", default="Duration(us)", help="duration column to compare (default Duration(us))")
    parser.add_argument("--report", type=Path, help="write the per-point comparison here (CSV)")
    parser.add_argument("--require-same-points", action="store_true",
                        help="also fail when a point exists on one side only")
    parser.add_argument("--summary", type=Path, help="also write the printed summary to this file")
    parser.add_argument("--exit-zero", action="store_true",
                        help="exit 0 even when points disagree (the workflow's comm_alignment rule: a disagreement "
                             "is a finding for the report, not a failed job)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    summary = validate_alignment(args.measured, args.reference, args.tolerance, args.column, args.report)
    print(summary.text())
    if args.summary:
        write_text_atomic(args.summary, summary.text() + "\n")
    if args.exit_zero:
        return 0
    if summary.disagreements or (args.require_same_points and summary.unmatched):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
