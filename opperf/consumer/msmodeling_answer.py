"""Ask msmodeling's own data sources how a database answers calls its runner issued (as msmodeling_record.py
records them), each rebuilt as the runner issues it: tensors on the meta device in their recorded dtype, the small
integer metadata (seq_lens, query_lens, query start locations) with their recorded values.

    python msmodeling_answer.py MSMODELING_DIR < {"database": DIR, "calls": [recorded call, ...]} > answers.json

The database is read by `ProfilingDataSource` wrapped in `InterpolatingDataSource`, as msmodeling's runner reads it
for `--performance-model profiling` (tensor_cast/core/model_runner.py). Answer per call: {"op", "exact" (latency of
the data source's own exact or padded match, else null), "source" (MEASURED / INTERPOLATED / null), "latency_us",
"method", "axes", "rule" (its shape-match rule), "miss_reason", "raised"} (lookup_answer). It runs in msmodeling's environment; like the
recorder, whose `rebuild` it uses, it imports nothing of opperf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def lookup_answer(base, wrapper, info, query_source) -> dict:
    """How msmodeling's data sources answer one OpInvokeInfo: {"exact" (the base source's own exact or padded
    match, else null), "source" (MEASURED / INTERPOLATED / null), "latency_us", "method", "axes", "rule" (its
    shape-match rule), "path", "miss_reason", "raised"}. Shared with opperf/consumer/msmodeling_oracle.py.

    `path` says which of the runtime's rules answered: `exact` (a row of the call's shapes), `padded` (a row whose
    token count the call's pads to, or the reverse), `interpolated` (between rows), `merged` (between rows, one of
    them the median of rows at one point), `zero_cost` / `accepted_miss` (the mapping's), or null (no answer)."""
    answer = {"exact": None, "source": None, "latency_us": None, "method": None, "axes": None, "rule": None,
              "path": None, "miss_reason": None, "raised": None}
    try:
        hit = base.lookup(info)
        if hit is not None and hit.source != query_source.PARTIAL:
            answer["exact"] = hit.latency_us
        else:
            answer["miss_reason"] = base.last_miss_reason
        result = wrapper.lookup(info)
    except Exception as exc:  # noqa: BLE001 — the runtime raising is an answer too
        answer["raised"] = f"{type(exc).__name__}: {exc}"
        return answer
    if result is None:
        answer["miss_reason"] = wrapper.last_miss_reason
    else:
        match = result.shape_match_info
        answer.update(source=result.source.name, latency_us=result.latency_us, method=result.details.get("method"),
                      axes=result.details.get("axes"),
                      rule=match.shape_match_rule if match is not None else None)
        answer["path"] = _path(base, info, result, answer)
    return answer


def _path(base, info, result, answer: dict) -> str:
    rule = answer["rule"] or ""
    if rule in ("zero_cost", "accepted_miss"):
        return rule
    if answer["exact"] is None:
        merged = any(meta.get("aggregation") == "median" for meta in result.details.get("matched_row_meta") or [])
        return "merged" if merged else "interpolated"
    if "padding" in rule:
        return "padded"
    if rule == "attention":
        return _attention_path(base, info, result)
    return "exact"


def _attention_path(base, info, result) -> str:
    """`exact` where a row of the call's q tokens holds the answered latency, else `padded` (the runtime's attention
    match does not say which row answered it; its latency does)."""
    kernel_type = result.details.get("kernel_type")
    frame = base._load_csv(kernel_type) if kernel_type else None
    if frame is None or not info.args:
        return "exact"
    tokens = int(info.args[0].shape[0])
    column = base._latency_col(frame)
    for shapes, latency in zip(frame.get("Input Shapes", []), frame.get(column, [])):
        try:
            same = abs(float(latency) - result.latency_us) <= 1e-9 * max(1.0, abs(result.latency_us))
            if same and int(str(shapes).strip('"').split(";")[0].split(",")[0]) == tokens:
                return "exact"
        except ValueError:
            continue
    return "padded"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    sys.path.insert(0, argv[0])
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import logging

    logging.disable(logging.WARNING)
    import torch

    import tensor_cast.ops  # noqa: F401  (registers the tensor_cast.* ops)
    from msmodeling_record import rebuild
    from tensor_cast.performance_model.op_invoke_info import OpInvokeInfo
    from tensor_cast.performance_model.profiling_database import (InterpolatingDataSource, ProfilingDataSource,
                                                                  QuerySource)

    request = json.load(sys.stdin)
    base = ProfilingDataSource(request["database"])
    wrapper = InterpolatingDataSource(base)
    answers = []
    for call in request["calls"]:
        func = torch.ops
        for part in call["op"].split("."):
            func = getattr(func, part)
        info = OpInvokeInfo(func, tuple(rebuild(call["args"], torch)),
                            {name: rebuild(value, torch) for name, value in call["kwargs"].items()},
                            rebuild(call["out"], torch))
        answers.append({"op": call["op"], **lookup_answer(base, wrapper, info, QuerySource)})
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
