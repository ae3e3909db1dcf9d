#!/usr/bin/env python
"""Parse raw profiler output into a per-kernel database directory (the parse stage).

Accepts torch_npu kernel_details*.csv (every header variant), msprof PROF_*/…/op_summary_*.csv, profiling
directories (scanned recursively; operator_details.csv / trace_view.json of a bundle are used for
FusedInferAttentionScore runtime metadata) and torch.profiler Chrome traces (*.json). Writes one
{KernelType}.csv per kernel type plus kernel_types.txt; the directory appears complete or not at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402
from opperf.devices import SEED_DEFAULT_DEVICE  # noqa: E402



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python scripts/parse_kernel_details.py --profiling-path kernel_details.csv --database-path out/\n"
               "  python scripts/parse_kernel_details.py --profiling-path prof_dir/ --vllm-version 0.18.0 \\\n"
               "      --torch-version 2.9.0 --cann-version 8.5      # → data/A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5\n"
               "exit codes: 0 ok, 2 bad input (one line on stderr names the file, line and field)")
    parser.add_argument("--profiling-path", nargs="+", required=True, metavar="PATH",
                        help="kernel_details*.csv / op_summary_*.csv file, torch.profiler trace (.json), or a "
                             "profiling directory (scanned recursively); several may be given")
    parser.add_argument("--database-path", type=Path, default=None,
                        help="output directory for {KernelType}.csv + kernel_types.txt (default: derived from "
                             "--device and the version flags)")
    parser.add_argument("--device", default=SEED_DEFAULT_DEVICE,
                        help=f"device catalog key or full name, used only to derive the output directory "
                             f"(default: {SEED_DEFAULT_DEVICE})")
    parser.add_argument("--vllm-version", help="vLLM-Ascend version, e.g. 0.18.0 (derives the output directory)")
    parser.add_argument("--torch-version", help="PyTorch version, e.g. 2.9.0 (derives the output directory)")
    parser.add_argument("--cann-version", help="CANN version, e.g. 8.5 (derives the output directory)")
    parser.add_argument("--data-root", type=Path, default=Path("data"),
                        help="root of derived database directories (default: ./data)")
    parser.add_argument("--trace-dir", type=Path, default=None,
                        help="write PARSE traces (spec/result/error_log) per kernel type under this directory")
    parser.add_argument("--task-id", default=None, help="trace task id (default: $OPPERF_TASK_ID or a timestamp)")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.parse import parse_profiles
    from opperf.parse.stage import database_path_for

    database_path = args.database_path or database_path_for(args.device, args.vllm_version, args.torch_version,
                                                            args.cann_version, args.data_root)
    database = parse_profiles(args.profiling_path, database_path, trace_dir=args.trace_dir, task_id=args.task_id)
    print(f"wrote {len(database.rows)} kernel type CSV(s) to {database_path} "
          f"({sum(database.skip_counts.values())} of {database.rows_read} rows skipped)")
    for profile, accounting in database.attribution.items():
        print(f"{profile}: {100 * accounting['share']:.2f} % of its {accounting['measure']} became rows"
              + "".join(f"; not in any row: {entry['us']:.1f} us ({100 * entry['us'] / accounting['device_us']:.2f} %)"
                        f" in {entry['activities']} {kind}"
                        for kind, entry in sorted(accounting["unattributed"].items(), key=lambda kv: -kv[1]["us"])))
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
