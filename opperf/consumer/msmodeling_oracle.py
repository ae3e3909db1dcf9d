"""Ask msmodeling's own runtime what it answers for queries: the oracle for opperf's model of it.

Run with a Python that can import torch and pandas (and scipy), given a msmodeling checkout:
    python opperf/consumer/msmodeling_oracle.py MSMODELING_DIR < request.json > answers.json
request: {"database": DIR, "ep_size": null, "queries": [{"op_name": "aten.mm.default",
          "inputs": [[[16, 256], "float32"], ...], "outputs": [[[16, 512], "float32"]],
          "attention": null | {"query": [shape, dtype], "key": [shape, dtype], "seq_lens": [..],
                               "has_query_lens": false}}]}
answer per query: msmodeling_answer.lookup_answer's {"exact": latency or null, "source":
                   "MEASURED"/"INTERPOLATED"/null, "latency_us", "method", "axes", "rule", "miss_reason", "raised"}
Standalone on purpose: it runs in msmodeling's environment, which need not have opperf installed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


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
    # the lookup itself is msmodeling_answer.py's, beside this file and standalone as it is
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    import tensor_cast.ops  # noqa: F401  (registers tensor_cast.* ops)
    from msmodeling_answer import lookup_answer
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
        answers.append(lookup_answer(base, wrapper, info, QuerySource))
    json.dump(answers, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
