#!/usr/bin/env python
"""Check a database the way its consumer (msmodeling's runtime) will use it: findable, unique, dense, interpolable.

  python scripts/check_database.py data/CPU/torch/torch2.13.0_cpu
  python scripts/check_database.py data/H100/torch/torch2.11.0_cuda13.0 --json check.json --markdown check.md

Per kernel type: rows (and rows kept in layouts/), rows with a duration, rows the runtime's lookup answers
with themselves, duplicate runtime keys, density per axis against config/density_standard.yaml, and the
holdout interpolation error (each interior replayed row predicted from its neighbours by the runtime's rule).
Exit 0 when every row with a duration is findable and no runtime key repeats, 1 otherwise, 2 on bad input.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.database.report import check_database, write_reports  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("database", help="a database directory: data/{device}/{stack}/{version_dir}")
    parser.add_argument("--density-standard", default="config/density_standard.yaml",
                        help="the axis density standard (default: %(default)s)")
    parser.add_argument("--json", help="write the full result as JSON here")
    parser.add_argument("--markdown", help="write the per-kernel-type table as markdown here")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    result = check_database(args.database, density_standard=args.density_standard)
    print(result["table"])
    write_reports(result, json_path=args.json, markdown_path=args.markdown)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
