#!/usr/bin/env python
"""How many of the observed Ascend kernel types the schema-driven replay could replay with no definition.

Reads the torch_npu and vLLM-Ascend wheels offline (no NPU, no CANN: opperf.replay.npu.torch_npu_wheel), then per
Type of resources/ascend/observed_kernel_types.tsv finds the op by name, binds its rows and runs them on meta
tensors (opperf.replay.npu.schema_coverage). Prints the table and writes npu_schema_coverage.json and README.md
to --output.

    python benchmarks/npu_schema_coverage.py            # torch_npu 2.9.0, vllm-ascend 0.18.0, CANN 8.5
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opperf.coverage import observed_kernel_types  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch-npu-version", default="2.9.0")
    parser.add_argument("--vllm-ascend-version", default="0.18.0")
    parser.add_argument("--cann-version", default="8.5")
    parser.add_argument("--wheel-cache", default=str(ROOT / ".cache" / "torch_npu"))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "npu_schema_coverage")
    args = parser.parse_args()

    import torch

    from opperf.replay.definitions import definition_for, load_definitions
    from opperf.replay.npu import vllm_ascend_wheel
    from opperf.replay.npu.offline_check import example_rows, profiled_rows
    from opperf.replay.npu.schema_coverage import rows_by_type, summarise, type_coverage
    from opperf.replay.npu.torch_npu_wheel import find_or_download_wheel, read_wheel, register_wheel

    contents = read_wheel(find_or_download_wheel(args.torch_npu_version, args.wheel_cache))
    registration = register_wheel(contents, cann_version=args.cann_version)
    vllm_contents = vllm_ascend_wheel.read_wheel(
        vllm_ascend_wheel.find_or_download_wheel(args.vllm_ascend_version, args.wheel_cache))
    registration.defined.update(vllm_ascend_wheel.register_wheel(vllm_contents))
    definitions = load_definitions(ROOT / "config" / "kernels" / "npu", backend="npu")
    rows = rows_by_type(profiled_rows([ROOT / "resources" / "profiles"])
                        + example_rows(ROOT / "tests" / "data" / "replay_npu" / "example_rows.csv"))
    coverages = []
    for kernel_type in observed_kernel_types():
        definition = definition_for(definitions, kernel_type, "npu")
        own = rows.get(kernel_type) or (rows.get(definition.type, []) if definition else [])
        coverages.append(type_coverage(kernel_type, own, registration.defined, definition is not None))
    summary = summarise(coverages)
    result = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "torch_npu_wheel": contents.path.name, "vllm_ascend_wheel": vllm_contents.path.name,
              "cann_version": args.cann_version, "summary": summary,
              "types": [vars(c) for c in coverages]}
    lines = [f"# Observed Ascend kernel types replayable from their op's schema ({result['date'][:10]})", "",
             f"Wheels read offline: {contents.path.name}, {vllm_contents.path.name} (CANN {args.cann_version} "
             f"answers for the meta kernels), torch {torch.__version__} CPU. Produced by "
             "`python benchmarks/npu_schema_coverage.py`; method in opperf/replay/npu/schema_coverage.py.", "",
             f"**{summary['replayable_without_definition']} of {summary['types']}** observed types replay with no "
             f"definition by the schema mechanism ({summary['of_which_verified_on_meta']} of them with every "
             f"checked row's outputs verified on meta tensors, the rest bound to the schema where the op has no "
             f"meta kernel); {summary[ 'op_found_no_rows']} more have an op by name but no row to check; "
             f"{summary['not_bound']} have an op whose schema the rows do not fit; {summary['no_op']} have no "
             f"registered op of their name (communication, CANN-internal, Triton kernels, fused kernels whose "
             f"API name differs from the kernel's).", "",
             "| Type | status | op | rows checked | has a definition | detail |", "|---|---|---|---|---|---|"]
    for c in coverages:
        detail = "; ".join(c.details)[:160].replace("|", "/")
        lines.append(f"| {c.kernel_type} | {c.status} | {', '.join(c.ops) or '-'} | {c.rows} {c.source} | "
                     f"{'yes' if c.has_definition else 'no'} | {detail} |")
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "npu_schema_coverage.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.output / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
