"""Grid rows for the lookups the performance model will make: one row per distinct query of the reference decoder.

The declarative patterns (grid.yaml) widen the profiled kernels along the density standard's axes. What they
cannot know is the exact argument layout a consumer's query arrives in: a decode step's `(batch, 1, hidden)`
activations, a RoPE slice of a fused QKV buffer, the ops TensorCast records at the framework level (`clone`,
`embedding`, `_softmax`, `topk`, …) whose kernels a profile files under other names. So the target models'
reference decoder is run on meta tensors under a TorchDispatchMode, as TensorCast runs a model
(`opperf.consumer.queries`), and every distinct non-view query becomes a row of the kernel type named
after its op, laid out exactly as a profiled call of that op would be (`opperf.parse.torch_trace.op_call_row`):
every schema argument in order, concrete scalars, the call's strides. Kernel types without a definition replay
from the op's schema (`opperf.replay.schema`); their op maps to them in op_mapping.yaml.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.contract import (ACCELERATOR_CORE, CONSUMER_QUERY, INPUT_DTYPES, INPUT_FORMATS, INPUT_SHAPES, OP_STATE,
                             OUTPUT_DTYPES, OUTPUT_FORMATS, OUTPUT_SHAPES, SOURCE, SOURCE_GENERATED,
                             TORCH_TO_PROFILER_DTYPE, parse_names, parse_shapes, row_signature)
from opperf.errors import OpperfError
from opperf.grid.memory import MemoryEstimator
from opperf.log import get_logger

log = get_logger("grid")

CONSUMER_BUCKET = "consumer_queries"
# The attention kernel `scaled_dot_product_attention` dispatches to on each back end (what TensorCast records).
ATTENTION_BY_BACKEND = {"cpu": "cpu", "cuda": "cuda"}
ACCELERATOR_CORE_BY_BACKEND = {"cpu": "CPU", "cuda": "CUDA"}      # a torch trace's Accelerator Core
DTYPES = ("bfloat16", "float16", "float32")   # torch dtype names; torch itself is imported only to record queries


@dataclass
class QueryRows:
    """The rows of the recorded queries, per kernel type, and what was left out and why."""

    rows: dict[str, list[dict]] = field(default_factory=dict)
    queries: int = 0
    views: int = 0
    over_hbm_budget: int = 0
    not_laid_out: dict[str, int] = field(default_factory=dict)   # op → queries whose arguments were not recorded
    recorder: str = ""            # who recorded the queries: msmodeling | transformers (opperf.consumer.recorder)
    # kernel type → rows laid between the recorded queries where the runtime's lookup looks (an attention row per
    # decode batch at each context, per 16 prefill tokens: opperf.consumer.msmodeling_queries.lookup_attention_calls)
    lookup_rows: dict[str, int] = field(default_factory=dict)

    def merged(self, other: QueryRows) -> QueryRows:
        """These rows and another recorder's, one list per kernel type (the grid drops repeated signatures)."""
        rows = {kernel: [*self.rows.get(kernel, []), *other.rows.get(kernel, [])]
                for kernel in (*self.rows, *(k for k in other.rows if k not in self.rows))}
        not_laid_out = dict(self.not_laid_out)
        for op, count in other.not_laid_out.items():
            not_laid_out[op] = not_laid_out.get(op, 0) + count
        lookup_rows = dict(self.lookup_rows)
        for kernel, count in other.lookup_rows.items():
            lookup_rows[kernel] = lookup_rows.get(kernel, 0) + count
        return QueryRows(rows, self.queries + other.queries, self.views + other.views,
                         self.over_hbm_budget + other.over_hbm_budget, not_laid_out,
                         ",".join(r for r in (self.recorder, other.recorder) if r), lookup_rows)


def record_consumer_queries(models_path: str | Path, models: Sequence[str], backend: str, dtype: str,
                            scenario_space: str | Path | None = None, space: str = "default",
                            num_layers: int | None = None):
    """The queries of `models` over a scenario space (config/scenarios.yaml's `space`): each a name or alias in
    `models_path` (the reference decoder, at its own TP sizes) or a transformers config.json (opperf.consumer.
    model_queries: run on meta as the model's own code runs)."""
    import torch

    from opperf.consumer.model_queries import model_source, model_steps, scenario_tp_sizes
    from opperf.consumer.queries import merge_scenario_queries
    from opperf.consumer.scenarios import DEFAULT_SCENARIO_SPACE, load_scenario_space
    from opperf.model_names import check_distinct_names, model_reference

    if backend not in ATTENTION_BY_BACKEND:
        raise OpperfError(f"consumer-query rows are recorded for torch back ends ({', '.join(ATTENTION_BY_BACKEND)})"
                          f"; {backend!r} databases are queried through TensorCast's own ops", field="backend")
    if dtype not in DTYPES:
        raise OpperfError(f"unknown consumer dtype {dtype!r}; one of {', '.join(DTYPES)}", field="--consumer-dtype")
    scenario_space = load_scenario_space(scenario_space or DEFAULT_SCENARIO_SPACE, space)
    check_distinct_names([model_reference(model, models_path) for model in models], field="--consumer-models")
    def steps():                 # every model's scenarios: a query two models issue is one query
        for model in models:
            source = model_source(model, models_path, num_layers=num_layers)
            tp_sizes, left_out = scenario_tp_sizes(source, scenario_space.tp_sizes, dtype=getattr(torch, dtype),
                                                   attention=ATTENTION_BY_BACKEND[backend])
            if left_out:
                log.warning("scenario space %r: %s is recorded at TP %s; left out: %s", space, source.name,
                            ", ".join(map(str, tp_sizes)),
                            "; ".join(f"TP {tp} ({reason})" for tp, reason in left_out.items()))
            if not tp_sizes:
                raise OpperfError(f"no TP size of scenario space {space!r} splits {source.name}: "
                                  + "; ".join(left_out.values()), field="tp_sizes")
            chosen = scenario_space.scenarios(source.name, tp_sizes)
            log.info("recording the consumer's queries: %d scenarios of %s (%s, attention %s)", len(chosen),
                     source.name, dtype, ATTENTION_BY_BACKEND[backend])
            yield from model_steps(source, chosen, dtype=getattr(torch, dtype), attention=ATTENTION_BY_BACKEND[backend])
    return merge_scenario_queries(steps())


def _list_dtype(arguments: dict) -> str:
    """The profiler dtype of an op's TensorList members (one per call), '' when it has none."""
    member = arguments.get("List dtype", "")
    return TORCH_TO_PROFILER_DTYPE.get(member, "")


def query_rows(recorded: Iterable, accelerator_core: str, estimator: MemoryEstimator | None = None) -> QueryRows:
    """One generated row per recorded non-view query, under the kernel type named after its op."""
    from opperf.parse.torch_trace import _MetaShapes, kernel_type_of, op_call_row

    meta = _MetaShapes()
    result = QueryRows()
    seen: set[tuple] = set()
    for item in recorded:
        if item.view:
            result.views += 1
            continue
        result.queries += 1
        namespace, name, _overload = item.query.op_name.split(".", 2)
        if item.arguments is None:
            result.not_laid_out[item.query.op_name] = result.not_laid_out.get(item.query.op_name, 0) + 1
            continue
        op = f"{namespace}::{name}"
        kernel_type = kernel_type_of(op)
        row = {OP_STATE: "eager", ACCELERATOR_CORE: accelerator_core,
               **op_call_row(op, item.arguments, accelerator_core, _list_dtype(item.arguments), meta),
               SOURCE: SOURCE_GENERATED, CONSUMER_QUERY: item.query.op_name}
        if estimator is not None and not _fits(row, estimator):
            result.over_hbm_budget += 1
            continue
        signature = (kernel_type, row_signature(row, kernel_type))
        if signature in seen:
            continue
        seen.add(signature)
        result.rows.setdefault(kernel_type, []).append(row)
    return result


def _fits(row: dict, estimator: MemoryEstimator) -> bool:
    return estimator.fits(parse_shapes(row[INPUT_SHAPES]), parse_names(row[INPUT_DTYPES]),
                          parse_names(row[INPUT_FORMATS]), parse_shapes(row[OUTPUT_SHAPES]),
                          parse_names(row[OUTPUT_DTYPES]), parse_names(row[OUTPUT_FORMATS]))
