#!/usr/bin/env python
"""Stage 7: write the replay report of one database from its replayed per-kernel CSVs.

    report.py --csv results/CPU/torch/torch2.13.0_cpu/replayed/*.csv --output-dir reports/CPU/torch/torch2.13.0_cpu \\
        --database CPU/torch/torch2.13.0_cpu --database-dir data/CPU/torch/torch2.13.0_cpu \\
        --benchmarks-root benchmarks/runs

Writes replay_report.md and replay_report.html (the same: headline numbers, per-kernel-type table, worst rows,
rows that did not replay, stage timings), duration_gap.csv (rows whose replay/profile ratio is outside --band),
summary.json (docs/report.md, "summary.json") and three PNG plots: replay_vs_profile.png (by kernel type),
duration_gap_histogram.png and status_by_kernel.png.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.errors import OpperfError  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--csv", nargs="+", required=True, help="per-kernel CSVs (replayed or final database)")
    parser.add_argument("--output-dir", required=True, help="reports/{device}/{stack}/{version_dir}")
    parser.add_argument("--database", required=True, help="{device}/{stack}/{version_dir}, the report's title")
    parser.add_argument("--backend", choices=["cpu", "cuda", "npu"], default="cpu",
                        help="the back end the rows were replayed on: recorded in summary.json, and the report "
                             "links that back end's accuracy explanation (default: %(default)s)")
    parser.add_argument("--band", type=float, nargs=2, default=[0.8, 1.2], metavar=("LOW", "HIGH"),
                        help="replay/profile ratio band; rows outside go into duration_gap.csv (default: 0.8 1.2)")
    parser.add_argument("--benchmarks-root", default="benchmarks/runs",
                        help="Snakemake benchmark files to take stage timings from (default: %(default)s)")
    parser.add_argument("--trace-dir", default="", help="the database's trace directory (summary task_log_dir)")
    parser.add_argument("--database-dir", default="",
                        help="the database built from these rows (data/{device}/{stack}/{version_dir}): rows are "
                             "then named by their line in its {Type}.csv (else in layouts/{Type}.csv), as it spells "
                             "them; without it, by their line in the --csv files")
    parser.add_argument("--parsed-dir", default="",
                        help="the parse stage's directory of this database: its trace_attribution.json (how much of "
                             "the traces' device time became rows) goes into the report; none there, none shown")
    parser.add_argument("--phase", default="",
                        help="the phase stage's table (scripts/phase_replay.py): folded into the rows first, so the "
                             "report shows what the database holds")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.report.build import read_attribution, read_profile_overhead, write_report

    key = args.database.strip("/").split("/")
    if len(key) != 3:
        raise OpperfError(f"expected device/stack/version_dir, got {args.database!r}", field="--database")
    write_report(args.csv, args.output_dir, title=args.database, backend=args.backend, band=tuple(args.band),
                 benchmarks_root=args.benchmarks_root, database_key=key, task_log_dir=args.trace_dir,
                 attribution=read_attribution(args.parsed_dir) if args.parsed_dir else None,
                 overhead=read_profile_overhead(args.parsed_dir) if args.parsed_dir else None,
                 phase_table=args.phase or None, database_dir=args.database_dir or None)
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
