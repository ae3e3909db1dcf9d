#!/usr/bin/env python
"""The consumer's queries, answered by msmodeling's own runtime: how many fall back to roofline.

`scripts/check_database.py --consumer-models` answers the reference decoder's queries with opperf's model of
the runtime. This asks the runtime itself: the same queries (recorded on meta tensors under a
TorchDispatchMode, as TensorCast records a model run) go to msmodeling's unmodified `ProfilingDataSource` and
the `InterpolatingDataSource` wrapping it, through `opperf/consumer/msmodeling_oracle.py` run in msmodeling's Python.
Each query is EXACT (the exact lookup answers; zero_cost entries answer 0), INTERPOLATED, MISS (the runtime
falls back to roofline) or RAISED; the table also says where opperf's model gave another status.

    python benchmarks/probes/consumer_lookup.py DB --msmodeling ../msmodeling --python ../msm-venv/bin/python \
        --consumer-models Qwen3-32B,DeepSeek-V3 --json benchmarks/results/runtime_lookup/consumer.json

Exit 1 if any query falls back to roofline or raises.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def status_of(answer: dict):
    """msmodeling's answer as an AnswerStatus: it does not tell a legal interpolation from an illegal one."""
    from opperf.consumer.status import AnswerStatus

    if answer["raised"]:
        return AnswerStatus.RAISES
    if answer["exact"] is not None:
        return AnswerStatus.EXACT
    if answer["source"] == "INTERPOLATED":
        return AnswerStatus.INTERPOLATED
    return AnswerStatus.MISS


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("database", type=Path)
    parser.add_argument("--msmodeling", type=Path, default=os.environ.get("OPPERF_MSMODELING_DIR"), required=False)
    parser.add_argument("--python", default=os.environ.get("OPPERF_MSMODELING_PYTHON", sys.executable),
                        help="a Python that imports msmodeling's requirements (default: $OPPERF_MSMODELING_PYTHON)")
    parser.add_argument("--consumer-models", default="Qwen3-32B,DeepSeek-V3")
    parser.add_argument("--consumer-dtype", default="bfloat16")
    parser.add_argument("--models", default=str(ROOT / "config" / "models.yaml"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.msmodeling is None:
        parser.error("--msmodeling (or $OPPERF_MSMODELING_DIR) must name a msmodeling checkout")

    from opperf.consumer.msmodeling_runtime import ask_runtime, query_spec
    from opperf.consumer.queries import answer, modelled_exact_lookup
    from opperf.consumer.runtime import load_op_mapping
    from opperf.consumer.status import AnswerStatus
    from opperf.errors import OpperfError
    from opperf.grid.queries import record_consumer_queries

    backend = (load_op_mapping(args.database).get("opperf") or {}).get("backend", "cpu")
    names = [m for m in args.consumer_models.split(",") if m]
    started = time.monotonic()
    recorded = record_consumer_queries(args.models, names, backend, args.consumer_dtype)
    recorded_s = time.monotonic() - started
    started = time.monotonic()
    try:
        theirs = ask_runtime(args.database, [r.query for r in recorded], args.msmodeling, args.python)
    except OpperfError as exc:
        raise SystemExit(str(exc)) from exc
    asked_s = time.monotonic() - started
    ours = answer(recorded, args.database, modelled_exact_lookup)
    statuses, calls, disagree = Counter(), Counter(), []
    by_op: dict[str, Counter] = {}
    for item, full, mine in zip(recorded, theirs, ours):
        status = status_of(full)
        statuses[status] += 1
        calls[status] += item.calls
        by_op.setdefault(item.query.op_name, Counter())[status] += 1
        modelled = {AnswerStatus.ZERO_COST: AnswerStatus.EXACT, AnswerStatus.ILLEGAL: AnswerStatus.INTERPOLATED,
                    AnswerStatus.DTYPE_UNMAPPED: AnswerStatus.MISS}.get(mine.status, mine.status)
        if modelled != status:
            disagree.append({"op": item.query.op_name, "inputs": [query_spec(t) for t in item.query.inputs],
                             "msmodeling": status, "opperf": mine.status, "miss_reason": full.get("miss_reason")})
    print(f"{'status':14} {'queries':>8} {'calls':>12}")
    for status in (AnswerStatus.EXACT, AnswerStatus.INTERPOLATED, AnswerStatus.MISS, AnswerStatus.RAISES):
        print(f"{status:14} {statuses[status]:>8} {calls[status]:>12}")
    print(f"{len(recorded)} distinct queries of {', '.join(n for n in names)} ({args.consumer_dtype}); "
          f"opperf's model disagrees on {len(disagree)}")
    for item in disagree[:20]:
        print("  ", item)
    if args.json:
        revision = subprocess.run(["git", "-C", str(args.msmodeling), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
        document = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                    "database": str(args.database), "msmodeling": revision or str(args.msmodeling),
                    "consumer_models": [n for n in names], "dtype": args.consumer_dtype,
                    "queries": len(recorded), "by_status": dict(statuses), "calls_by_status": dict(calls),
                    "by_op": {op: dict(c) for op, c in sorted(by_op.items())}, "opperf_disagrees": disagree,
                    "seconds": {"record": round(recorded_s, 1), "msmodeling_lookup": round(asked_s, 1)}}
        args.json.write_text(json.dumps(document, indent=1) + "\n")
    return 0 if statuses[AnswerStatus.MISS] == 0 and statuses[AnswerStatus.RAISES] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
