"""Ask msmodeling's own runtime what it answers for queries: the oracle for opperf's model of it.

Run with a Python that can import torch and pandas (and scipy), given a msmodeling checkout:
    python opperf/database/msmodeling_oracle.py MSMODELING_DIR < request.json > answers.json
request: {"database": DIR, "ep_size": null, "queries": [{"op_name": "aten.mm.default",
          "inputs": [[[16, 256], "float32"], ...], "outputs": [[[16, 512], "float32"]],
          "attention": null | {"query": [shape, dtype], "key": [shape, dtype], "seq_lens": [..],
                               "has_query_lens": false}}]}
answer per query: {"exact": latency or null, "source": "MEASURED"/"INTERPOLATED"/null, "latency_us",
                   "method", "axes", "miss_reason", "raised"}
Standalone on purpose: it runs in msmodeling's environment, which need not have opperf installed.
"""

from __future__ import annotations

import json
import sys


def _tensor(spec, torch):
    shape, dtype = spec
    return torch.empty(tuple(shape), dtype=getattr(torch, dtype), device="meta")


def _op(name, torch):
    value = torch.ops
    for part in name.split("."):
        value = getattr(value, part)
    return value


def main() -> int:
    sys.path.insert(0, sys.argv[1])
    import torch

    import tensor_cast.ops  # noqa: F401  (registers tensor_cast.* ops)
    from tensor_cast.performance_model.op_invoke_info import OpInvokeInfo
    from tensor_cast.performance_model.profiling_database import (
        InterpolatingDataSource,
        ProfilingDataSource,
        QuerySource,
    )

    request = json.load(sys.stdin)
    base = ProfilingDataSource(request["database"])
    wrapper = InterpolatingDataSource(base)
    answers = []
    for query in request["queries"]:
        attention = query.get("attention")
        if attention:
            q = _tensor(attention["query"], torch)
            k = _tensor(attention["key"], torch)
            seq_lens = torch.tensor(attention["seq_lens"], dtype=torch.int32)
            query_lens = torch.ones(len(attention["seq_lens"]), dtype=torch.int32) if attention.get(
                "has_query_lens") else None
            args = (q, k, k, None, None, None, seq_lens, query_lens)
        else:
            args = tuple(_tensor(spec, torch) for spec in query["inputs"])
        outputs = [_tensor(spec, torch) for spec in query.get("outputs", [])]
        out = outputs[0] if len(outputs) == 1 else tuple(outputs)
        info = OpInvokeInfo(_op(query["op_name"], torch), args, {}, out)
        answer = {"exact": None, "source": None, "latency_us": None, "method": None, "axes": None,
                  "miss_reason": None, "raised": None}
        try:
            hit = base.lookup(info)
            if hit is not None and hit.source != QuerySource.PARTIAL:
                answer["exact"] = hit.latency_us
            result = wrapper.lookup(info)
        except Exception as exc:  # the runtime raising is an answer too
            answer["raised"] = f"{type(exc).__name__}: {exc}"
            answers.append(answer)
            continue
        if result is None:
            answer["miss_reason"] = wrapper.last_miss_reason
        else:
            answer.update(source=result.source.name, latency_us=result.latency_us,
                          method=result.details.get("method"), axes=result.details.get("axes"))
        answers.append(answer)
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
