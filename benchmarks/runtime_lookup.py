#!/usr/bin/env python
"""Ask msmodeling's own runtime for every row of our databases: found, missed or raised, per kernel type.

The consumer of an opperf database is msmodeling's TensorCast runtime. This script imports its unmodified
lookup code from a checkout (`--msmodeling DIR`, or $OPPERF_MSMODELING_DIR), and for every row with a
duration of every database given, issues the query TensorCast would issue for a call with that row's
tensors: for each framework op that op_mapping.yaml maps to the row's kernel type, meta tensors of the
row's rank >= 1 tensor slots in slot order (dtype as torch names it) and a meta output of the row's first
output shape, as an `OpInvokeInfo`. It then calls `ProfilingDataSource.lookup` (exact) and the
`InterpolatingDataSource` wrapping it (what `ModelRunner` uses). A row is *found* when the exact lookup
returns its own latency (within 1e-9 relative) from its own kernel type for one of the mapped ops; an elementwise
row is *answered by its output* when the runtime answers its query with the first row of its output shape (another
dtype, scaled, or another input regime: rows the database writes as interpolation points, and the database check
counts as `answered_scaled`): the row opperf's model finds, of the same output shape, at the latency it says.
opperf's own model of the same contract (`opperf.consumer.runtime.find`) answers the same queries, and
the table shows where the two disagree.

Run it with a Python that can import msmodeling (its requirements: torch, transformers, pandas, scipy …):

    python benchmarks/runtime_lookup.py --msmodeling ../msmodeling data/CPU/torch/torch2.13.0_cpu \
        data/A3/vllm_ascend/vllm0.18.0_torch2.9.0_cann8.5 --json benchmarks/results/runtime_lookup/result.json

`--rows DIR DEVICE VERSION_DIR` builds a database first from a directory of replayed rows (the CUDA benchmark's
`benchmarks/results/cuda_replay/database/dense`, in git at ecdd54f, say) with the database stage's own code, into a
temporary directory, and checks that too.

Prints one line per kernel type and a total per database; writes the same as JSON. Exit 1 if any lookup
raised or any row the runtime should find was neither found nor answered by its output.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TORCH_DTYPES = {"DT_BF16": "bfloat16", "DT_FLOAT16": "float16", "DT_FLOAT": "float32", "DT_DOUBLE": "float64",
                "DT_INT64": "int64", "DT_INT32": "int32", "DT_INT8": "int8", "DT_UINT8": "uint8", "DT_BOOL": "bool",
                "DT_INT16": "int16"}


def _meta(shape, name, torch):
    from opperf import contract

    canonical = contract.canonical_dtype(name) if contract.is_known_dtype(name) else None
    dtype = getattr(torch, TORCH_DTYPES.get(canonical, "float32"))
    return torch.empty(shape, dtype=dtype, device="meta")


def _op(name: str, torch):
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def check_database(database: Path, msmodeling: Path) -> dict:
    sys.path.insert(0, str(msmodeling))
    import torch
    import yaml
    from tensor_cast.performance_model.op_invoke_info import OpInvokeInfo
    from tensor_cast.performance_model.profiling_database import InterpolatingDataSource, ProfilingDataSource

    from opperf import contract
    from opperf.consumer.runtime import answered_by_output, answered_latency, find, row_latency, row_query
    from opperf.io import read_database_csv

    mapping = yaml.safe_load((database / "op_mapping.yaml").read_text())
    operator_mappings = mapping.get("operator_mappings", {})
    exact = ProfilingDataSource(database)
    wrapped = InterpolatingDataSource(ProfilingDataSource(database))
    tables = {p.stem: read_database_csv(p) for p in sorted(database.glob("*.csv"))}
    kernels = {}
    for kernel_type, table in tables.items():
        ops = [op for op, m in operator_mappings.items()
               if kernel_type in (m.get("kernel_type"), *m.get("alternate_kernel_types", []))]
        entry = {"rows": len(table), "rows_with_duration": 0, "found": 0, "answered_by_output": 0,
                 "found_by_opperf_model": 0,
                 "interpolating_hits": 0, "exceptions": 0, "model_disagrees": 0, "mapped_ops": ops, "misses": []}
        for index, record in enumerate(table.to_dict(orient="records")):
            latency = row_latency(record)
            if latency is None:
                continue
            entry["rows_with_duration"] += 1
            query, why = row_query(record)
            shapes = [s for s in contract.parse_shapes(record[contract.INPUT_SHAPES]) if s is not None]
            dtypes = [n for n in contract.parse_names(record[contract.INPUT_DTYPES]) if n]
            outputs = [s for s in contract.parse_shapes(record[contract.OUTPUT_SHAPES]) if s is not None]
            out_dtypes = [n for n in contract.parse_names(record[contract.OUTPUT_DTYPES]) if n]
            found = model_found = wrapped_hit = by_output = False
            reasons = []
            for op_name in ops:
                try:
                    func = _op(op_name, torch)
                except AttributeError:
                    reasons.append(f"{op_name}: not an op of this torch")
                    continue
                args = tuple(_meta(s, dtypes[i] if i < len(dtypes) else "", torch) for i, s in enumerate(shapes))
                out = _meta(outputs[0], out_dtypes[0] if out_dtypes else "", torch) if outputs else None
                info = OpInvokeInfo(func, args, {}, out)
                try:
                    result = exact.lookup(info)
                    wrapped_result = wrapped.lookup(info)
                except Exception as exc:  # the runtime raising is what this benchmark exists to catch
                    entry["exceptions"] += 1
                    reasons.append(f"{op_name}: raised {type(exc).__name__}: {exc}")
                    traceback.print_exc(limit=2)
                    continue
                hit = (result is not None and result.details.get("kernel_type", kernel_type) == kernel_type
                       and math.isclose(result.latency_us, latency, rel_tol=1e-9))
                found |= hit
                wrapped_hit |= wrapped_result is not None
                if not hit:
                    reasons.append(f"{op_name}: {exact.last_miss_reason or 'another row answered'}")
                if query is not None:
                    model = find(tables, operator_mappings[op_name], query)
                    model_found |= model == (kernel_type, index)
                    by_output |= (not hit and result is not None
                                  and answered_by_output(operator_mappings[op_name], table, kernel_type, index, model)
                                  and math.isclose(result.latency_us, answered_latency(
                                      tables, operator_mappings[op_name], query, model) or -1.0, rel_tol=1e-9))
            entry["found"] += found
            entry["answered_by_output"] += by_output and not found
            entry["found_by_opperf_model"] += model_found
            entry["interpolating_hits"] += wrapped_hit
            entry["model_disagrees"] += found != model_found
            if not found and not by_output:
                entry["misses"].append({"line": index + 2, "why": "; ".join(reasons) or why or "no mapped op"})
        kernels[kernel_type] = entry
    totals = {key: sum(k[key] for k in kernels.values())
              for key in ("rows", "rows_with_duration", "found", "answered_by_output", "found_by_opperf_model",
                          "interpolating_hits", "exceptions", "model_disagrees")}
    return {"database": str(database), "kernel_types": kernels, "totals": totals}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("databases", nargs="*", type=Path, help="database directories (data/{device}/{stack}/{version})")
    parser.add_argument("--msmodeling", type=Path, default=os.environ.get("OPPERF_MSMODELING_DIR"),
                        help="a msmodeling checkout (default $OPPERF_MSMODELING_DIR)")
    parser.add_argument("--rows", nargs=3, action="append", default=[], metavar=("DIR", "DEVICE", "VERSION_DIR"),
                        help="also build and check a database from replayed rows (repeatable)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    if not args.msmodeling or not (args.msmodeling / "tensor_cast").is_dir():
        parser.error("--msmodeling must name a msmodeling checkout (a directory holding tensor_cast/)")
    import logging

    logging.disable(logging.WARNING)
    import tempfile

    from opperf.database.build import build_database_directory

    databases = list(args.databases)
    scratch = tempfile.TemporaryDirectory(prefix="runtime_lookup_")
    for rows_dir, device, version_dir in args.rows:
        target = Path(scratch.name) / Path(rows_dir).name / version_dir
        build_database_directory(rows_dir, device, target, ROOT / "config" / "devices.yaml", ROOT / "config" / "kernels")
        databases.append(target)
    results = [check_database(d, args.msmodeling) for d in databases]
    for result, source in zip(results[len(args.databases):], args.rows):
        result["database"] = f"{source[0]} (built as {source[2]})"
    print(f"{'database / kernel type':60} {'rows':>5} {'w/dur':>5} {'found':>5} {'out':>4} {'model':>5} "
          f"{'interp':>6} {'raised':>6}")
    for result in results:
        for name, k in [*((f"  {t}", k) for t, k in result["kernel_types"].items()),
                        (result["database"], result["totals"])]:
            print(f"{name:60} {k['rows']:5} {k['rows_with_duration']:5} {k['found']:5} {k['answered_by_output']:4} "
                  f"{k['found_by_opperf_model']:5} {k['interpolating_hits']:6} {k['exceptions']:6}")
    commit = subprocess.run(["git", "-C", str(args.msmodeling), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    document = {"date": dt.date.today().isoformat(), "machine": platform.node(), "python": platform.python_version(),
                "msmodeling_commit": commit or "unknown (not a git checkout)", "results": results}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    bad = any(r["totals"]["exceptions"]
              or r["totals"]["found"] + r["totals"]["answered_by_output"] < r["totals"]["rows_with_duration"]
              for r in results)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
