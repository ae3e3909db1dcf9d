"""msmodeling's own runtime as the answerer: the queries go to its unmodified `ProfilingDataSource` and the
`InterpolatingDataSource` wrapping it, through opperf/consumer/msmodeling_oracle.py run in a Python that imports
msmodeling (its own environment: torch, pandas, scipy), in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from opperf.consumer.queries import Answer, RecordedQuery
from opperf.consumer.status import AnswerStatus
from opperf.errors import OpperfError

ORACLE = Path(__file__).with_name("msmodeling_oracle.py")


def query_spec(tensor) -> list:
    """A query tensor as the oracle's request spells it: [shape, torch dtype name]."""
    return [list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]


def ask_runtime(database: str | Path, queries, msmodeling: str | Path, python: str | None = None) -> list[dict]:
    """msmodeling's answer to each query (the oracle's JSON: exact, source, latency_us, miss_reason, raised)."""
    request = {"database": str(database), "queries": [
        {"op_name": q.op_name, "inputs": [query_spec(t) for t in q.inputs], "outputs": [query_spec(t) for t in q.outputs],
         "attention": None} for q in queries]}
    python = python or os.environ.get("OPPERF_MSMODELING_PYTHON") or sys.executable
    done = subprocess.run([python, str(ORACLE), str(msmodeling)], input=json.dumps(request), capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise OpperfError(f"msmodeling's lookup failed to run with {python}: {done.stderr.strip()[-2000:]}",
                          path=msmodeling)
    return json.loads(done.stdout)


def runtime_answers(database: str | Path, recorded: Sequence[RecordedQuery], msmodeling: str | Path,
                    python: str | None = None) -> list[Answer]:
    """The recorded queries as msmodeling's runtime answers them, in `queries.Answer` form: EXACT,
    INTERPOLATED (the runtime does not say whether legally), MISS (roofline), DTYPE_UNMAPPED (roofline: a dtype it
    cannot spell), RAISES."""
    from opperf.consumer.queries import mark_dtype_unmapped
    from opperf.consumer.runtime import load_op_mapping

    answers = []
    for item, theirs in zip(recorded, ask_runtime(database, [r.query for r in recorded], msmodeling, python)):
        if theirs.get("raised"):
            answers.append(Answer(item, AnswerStatus.RAISES, None, theirs["raised"]))
        elif theirs.get("exact") is not None:
            answers.append(Answer(item, AnswerStatus.EXACT, float(theirs["exact"]), "msmodeling exact"))
        elif theirs.get("source") == "INTERPOLATED":
            answers.append(Answer(item, AnswerStatus.INTERPOLATED, float(theirs["latency_us"]),
                                  f"msmodeling {theirs.get('method')} over {theirs.get('axes')}"))
        else:
            answers.append(Answer(item, AnswerStatus.MISS, None, f"msmodeling: {theirs.get('miss_reason')}"))
    return mark_dtype_unmapped(answers, load_op_mapping(database).get("operator_mappings") or {})
