#!/usr/bin/env python
"""Plot collective bus bandwidth against message size (PNG) and tabulate how close the largest messages
come to a link limit (Markdown)."""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.comm.plot import load_runs, plot_bus_bandwidth, write_summary  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, epilog="example:\n  python scripts/plot_comm_bandwidth.py "
                                     "--run 4xH200=benchmarks/results/comm/h200x4 --limit-gbps 450 "
                                     "--output busbw.png --summary busbw.md",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=PATH",
                        help="a run's label and the directory holding its collective CSVs (searched recursively) "
                             "or one collective CSV; repeat for several runs, or with one label for several CSVs")
    parser.add_argument("--output", required=True, type=Path, help="PNG to write")
    parser.add_argument("--limit-gbps", type=float, help="draw this link limit (GB/s) and compare busbw with it")
    parser.add_argument("--limit-label", default="link limit", help="its name on the plot")
    parser.add_argument("--title", default="")
    parser.add_argument("--summary", type=Path, help="Markdown table of the largest messages (needs --limit-gbps)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    runs = []
    for item in args.run:
        label, separator, directory = item.partition("=")
        if not separator or not label or not directory:
            raise OpperfError(f"--run takes LABEL=PATH, got {item!r}", field="--run")
        runs.append((label, directory))
    frame = load_runs(runs)
    plot_bus_bandwidth(frame, args.output, args.limit_gbps, args.limit_label, args.title)
    if args.summary:
        if not args.limit_gbps:
            raise OpperfError("--summary compares with a limit: give --limit-gbps", field="--summary")
        write_summary(frame, args.limit_gbps, args.summary)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
