#!/usr/bin/env python
"""Check the NPU kernel definitions against torch_npu's own schemas and meta kernels, without an NPU.

Downloads the torch_npu (and vllm-ascend) wheels once (pip, no dependencies) into --wheel-cache and reads them
as zips: nothing of torch_npu, vLLM-Ascend or CANN is installed or imported. Exit 0: every definition bound
(and, where a meta kernel exists, produced the row's output shapes/dtypes); 1: some did not (listed in
--output); 2: bad input.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opperf.cli import add_logging_args, run_cli  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    version = parser.add_mutually_exclusive_group(required=True)
    version.add_argument("--torch-npu-version", help="torch_npu release to check against, e.g. 2.9.0")
    version.add_argument("--version-dir", help="a stack's version directory (vllm0.18.0_torch2.9.0_cann8.5): its "
                         "torch version names the torch_npu release, its CANN version answers the meta kernels")
    parser.add_argument("--vllm-ascend-version", help="vllm-ascend release whose custom ops (_C_ascend, vllm) to bind; "
                        "default: the version directory's vllm version")
    parser.add_argument("--wheel-cache", default=".cache/torch_npu", help="where the wheel is (or is downloaded to)")
    parser.add_argument("--profiles", nargs="*", default=["resources/profiles"],
                        help="profiler tables or directories (kernel_details*.csv, op_summary_*.csv)")
    parser.add_argument("--example-rows", nargs="*", default=["tests/data/replay_npu/example_rows.csv"],
                        help="hand-made example rows (Type + base columns), reported apart from profiled rows")
    parser.add_argument("--definitions", default="config/kernels/npu", help="NPU kernel definitions directory")
    parser.add_argument("--output", required=True, help="markdown report: the per-definition table and every failure")
    add_logging_args(parser)
    return parser


def main(args: argparse.Namespace) -> int:
    from opperf.replay.npu.offline_check import (blocking_failures, run_offline_check, torch_npu_version_for,
                                                 vllm_ascend_version_for)

    cann, version, vllm_ascend, kernel_types = "8.5", args.torch_npu_version, args.vllm_ascend_version, None
    if args.version_dir:
        from opperf.coverage import observed_kernel_types
        from opperf.versions import parse_version_dir

        version, cann = torch_npu_version_for(args.version_dir), parse_version_dir(args.version_dir).runtime_version
        vllm_ascend = vllm_ascend or vllm_ascend_version_for(args.version_dir)
        observed = [t for t, dirs in observed_kernel_types().items() if args.version_dir in dirs]
        kernel_types = observed or None          # a stack the observed list does not know: every definition
    summaries, results = run_offline_check(version, args.wheel_cache, args.profiles, args.example_rows,
                                           args.definitions, args.output, cann_version=cann,
                                           vllm_ascend_version=vllm_ascend, kernel_types=kernel_types)
    failures = blocking_failures(results)
    print(Path(args.output).read_text(encoding="utf-8").split("\n\n", 2)[1])
    for failure in failures:
        print(f"FAILED {failure.kernel_type} {failure.origin} [{failure.status}] {failure.reason}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_cli(build_parser(), main))
