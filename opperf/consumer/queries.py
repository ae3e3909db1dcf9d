"""The consumer's view: the lookups a performance model issues for the reference decoder, and their answers.

A performance model such as msmodeling's TensorCast runs the model on meta tensors under `torch.no_grad()`
with a `TorchDispatchMode` and looks up every op that reaches the mode, as `(func, args, kwargs, out)`. Which
ops those are is torch's decision, not the model code's: `F.linear` arrives as `t` + `mm` (2-D input) or
`view` + `mm` + `_unsafe_view` (3-D), a contiguous-slice linear as `expand` + `bmm`, and views, splits and
creations arrive too. Recording the reference decoder (`opperf.workload.model`) the same way gives the queries a
database must answer; `answer` says for each whether the runtime finds it exactly, interpolates it legally,
interpolates it illegally or falls back to its roofline model.

Two choices are the model's, not TensorCast's: the attention kernel is the one the target device dispatches
`scaled_dot_product_attention` to (on meta torch would pick the unfused math path), and a MoE router's token
counts, which meta tensors do not have, are the balanced split a router aims for.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opperf.consumer.interpolation import Database, Interpolation, Query, TensorSpec, query_dtype
from opperf.consumer.scenarios import Scenario, ScenarioSpace, load_scenario_space
from opperf.consumer.status import AnswerStatus
from opperf.contract import PROFILER_TYPE_TO_TORCH, SCALAR_TYPE_NAMES
from opperf.errors import OpperfError
from opperf.workload.model import DecoderDims, ReferenceDecoder, load_model_dims

# The models `reference_queries` records by default; the scenarios, config/scenarios.yaml's `default` space.
REFERENCE_MODELS = ("Qwen3-32B", "DeepSeek-V3")


# --- recording --------------------------------------------------------------------------------------------

def _tensors(values) -> list[torch.Tensor]:
    """Tensors among `values` and inside its lists/tuples (one level, as the runtime flattens them)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(item for item in value if isinstance(item, torch.Tensor))
    return found


def _spec(tensor: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(int(d) for d in tensor.shape), tensor.dtype)


def query_of(func, args, out) -> Query:
    """The lookup a dispatch-mode performance model makes for one op: tensor inputs with ndim > 0 in argument
    order (the runtime ignores 0-d tensors and kwargs), and the output tensors."""
    inputs = tuple(_spec(t) for t in _tensors(args) if t.ndim > 0)
    outputs = tuple(_spec(t) for t in _tensors(out if isinstance(out, (list, tuple)) else [out]))
    return Query(str(func).removeprefix("torch.ops."), inputs, outputs)


# torch dtype → torch.profiler's record_shapes spelling of a tensor's type, and → c10::ScalarType code (how the
# profiler records a `ScalarType` argument): a recorded query's arguments read as a trace's op event would.
_PROFILER_TYPES = {torch_name: profiler for profiler, torch_name in PROFILER_TYPE_TO_TORCH.items()
                   if profiler not in ("long",)}
_SCALAR_TYPE_CODES = {name: code for code, name in SCALAR_TYPE_NAMES.items()}


def _profiler_value(value) -> tuple[object, str, str, object]:
    """One argument as torch.profiler records it: (Input Dims, Input type, Concrete Inputs, Input Strides)."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return list(value.shape), _PROFILER_TYPES.get(dtype, dtype), "", list(value.stride())
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return [list(v.shape) for v in value], "TensorList", "", [list(v.stride()) for v in value]
    if isinstance(value, torch.dtype):
        code = _SCALAR_TYPE_CODES.get(str(value).removeprefix("torch."))
        return [], "Scalar", "" if code is None else str(code), []
    if value is None or isinstance(value, (str, torch.device, torch.layout, torch.memory_format)):
        return [], "", "", []
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return [], "Scalar", f"{value:.0f}.", []       # the profiler prints an integral double as `0.`
    if isinstance(value, (bool, int, float)):
        return [], "Scalar", str(value), []
    if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float)) for v in value):
        return [], "GenericList", str(list(value)), []
    return [], "", "", []


def profiler_args(func, args, kwargs) -> dict:
    """An op call's arguments in the form torch.profiler records them (every schema argument in order, defaults
    filled in), so that a recorded query becomes a row exactly as a profiled call of the op would."""
    schema = func._schema
    values = list(args)
    for argument in schema.arguments[len(values):]:
        if kwargs and argument.name in kwargs:
            values.append(kwargs[argument.name])
        elif argument.has_default_value():
            values.append(argument.default_value)
        else:
            values.append(None)
    recorded = [_profiler_value(v) for v in values]
    members = [v[0] for v in values if isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor)]
    return {"Input Dims": [r[0] for r in recorded], "Input type": [r[1] for r in recorded],
            "Concrete Inputs": [r[2] for r in recorded], "Input Strides": [r[3] for r in recorded],
            # What a trace does not record and a recorded call knows: the dtype of its TensorList's members.
            "List dtype": str(members[0].dtype).removeprefix("torch.") if members else ""}


class QueryRecorder(TorchDispatchMode):
    """Counts the queries of every op reaching dispatch; remembers which ops are views (no kernel runs) and,
    per query, the arguments of its first call as a profiler records them (what a database row is made of)."""

    def __init__(self):
        super().__init__()
        self.calls: Counter[Query] = Counter()
        self.views: set[str] = set()
        self.arguments: dict[Query, dict] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        query = query_of(func, args, out)
        self.calls[query] += 1
        if query not in self.arguments:
            self.arguments[query] = profiler_args(func, args, kwargs)
        if getattr(func, "is_view", False) or func is torch.ops.aten._unsafe_view.default:
            self.views.add(query.op_name)      # what the runtime's analytic fallback counts as free
        return out


def _cpu_flash_attention(q, k, v, is_causal=False):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal)[0]


def _cuda_cudnn_attention(q, k, v, is_causal=False):
    return torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, 0.0, is_causal, False)[0]


# The kernel each target's `scaled_dot_product_attention` dispatches to for the decoder's inputs (dense, no
# mask, no dropout): what its profile (and so its database) records.
ATTENTION_KERNELS: dict[str, Callable | None] = {
    "cpu": _cpu_flash_attention,
    "cuda": _cuda_cudnn_attention,
    "math": None,          # torch's own choice on meta: the unfused math decomposition
}


def rank_dims(dims: DecoderDims, tp: int) -> DecoderDims:
    """One tensor-parallel rank's share: heads, KV heads (replicated once fewer than ranks), MLP and expert
    widths and the vocabulary split `tp` ways; hidden size and head_dim unchanged."""
    if tp < 1 or dims.num_attention_heads % tp:
        raise OpperfError(f"TP size {tp} does not divide num_attention_heads {dims.num_attention_heads}",
                          field="tp")
    return replace(dims, num_attention_heads=dims.num_attention_heads // tp,
                   num_key_value_heads=max(1, dims.num_key_value_heads // tp),
                   intermediate_size=dims.intermediate_size // tp,
                   moe_intermediate_size=dims.moe_intermediate_size // tp,
                   vocab_size=math.ceil(dims.vocab_size / tp))


def record_step(dims: DecoderDims, scenario: Scenario, dtype: torch.dtype, attention: str) -> QueryRecorder:
    """The queries of one forward step of a decoder with `dims`, built and run on meta tensors."""
    if attention not in ATTENTION_KERNELS:
        raise OpperfError(f"unknown attention kernel {attention!r}; one of {sorted(ATTENTION_KERNELS)}",
                          field="attention")
    decoder = ReferenceDecoder(dims, "meta", dtype)
    if ATTENTION_KERNELS[attention] is not None:
        decoder.scaled_dot_product_attention = ATTENTION_KERNELS[attention]
    decoder.prepare_rope(scenario.context + scenario.tokens)
    tokens = torch.empty(scenario.batch, scenario.tokens, dtype=torch.long, device="meta")
    if scenario.phase == "prefill":
        cache, start = decoder.new_cache(), 0
    else:
        shape = (scenario.batch, dims.num_key_value_heads, scenario.context, dims.head_dim)
        cache = [(torch.empty(shape, dtype=dtype, device="meta"), torch.empty(shape, dtype=dtype, device="meta"))
                 for _ in range(dims.num_hidden_layers)]
        start = scenario.context
    recorder = QueryRecorder()
    with torch.no_grad(), recorder:
        decoder.step(tokens, start, cache)
    return recorder


def scenario_queries(dims: DecoderDims | None, scenario: Scenario, dtype: torch.dtype, attention: str,
                     num_layers: int, record: Callable[[int], QueryRecorder] | None = None,
                     ) -> tuple[Counter[Query], set[str], dict[Query, dict]]:
    """Query counts of a `num_layers`-deep step, from a 1-layer and a 2-layer run (the layers are identical),
    the view ops among them and each query's recorded arguments. `record(layers)` records a step of any model
    (opperf.consumer.model_queries); by default the reference decoder of `dims`."""
    if record is None:
        def record(layers: int) -> QueryRecorder:
            return record_step(replace(dims, num_hidden_layers=layers), scenario, dtype, attention)
    one = record(1)
    two = record(2) if num_layers > 1 else one
    counts: Counter[Query] = Counter()
    for query in one.calls.keys() | two.calls.keys():
        per_layer = two.calls[query] - one.calls[query]
        counts[query] = one.calls[query] - per_layer + num_layers * per_layer
    return +counts, one.views | two.views, {**two.arguments, **one.arguments}


@dataclass
class RecordedQuery:
    """One distinct query, how often a workload issues it, and in which scenarios."""

    query: Query
    calls: int
    scenarios: list[str]
    view: bool = False    # the op is a view: no kernel runs, op_mapping should mark it zero_cost
    arguments: dict | None = None   # the first call's arguments as torch.profiler records them (profiler_args)


def scenarios(models: Sequence[str] = REFERENCE_MODELS, space: ScenarioSpace | None = None) -> list[Scenario]:
    """Every scenario of `space` (default: config/scenarios.yaml's `default`) at its TP sizes, for each model:
    every model's prefill steps, then every model's decode steps."""
    space = space or load_scenario_space()
    return ([Scenario(m, tp, "prefill", 1, t) for m in models for tp in space.tp_sizes for t in space.prefill_tokens]
            + [Scenario(m, tp, "decode", b, 1, c) for m in models for tp in space.tp_sizes
               for c in space.decode_contexts for b in space.decode_batches])


def merge_scenario_queries(steps: Iterable[tuple[str, tuple[Counter[Query], set[str], dict[Query, dict]]]]
                           ) -> list[RecordedQuery]:
    """One RecordedQuery per distinct query of (scenario label, scenario_queries result) pairs: its calls summed
    over the scenarios, the labels of those that issue it, whether its op is a view and its first recorded
    arguments; most-called first."""
    totals: Counter[Query] = Counter()
    where: dict[Query, list[str]] = {}
    views: set[str] = set()
    arguments: dict[Query, dict] = {}
    for label, (counts, scenario_views, scenario_arguments) in steps:
        views |= scenario_views
        for query, recorded in scenario_arguments.items():
            arguments.setdefault(query, recorded)
        for query, calls in counts.items():
            totals[query] += calls
            where.setdefault(query, []).append(label)
    return [RecordedQuery(q, calls, where[q], q.op_name in views, arguments.get(q))
            for q, calls in sorted(totals.items(), key=lambda item: (-item[1], item[0].op_name, str(item[0])))]


def reference_queries(models_path: str | Path, scenario_list: Iterable[Scenario] | None = None, *,
                      dtype: torch.dtype = torch.bfloat16, attention: str = "cpu",
                      num_layers: int | None = None) -> list[RecordedQuery]:
    """The distinct queries of every scenario (default: the two reference models over config/scenarios.yaml's
    `default` space: TP 1/4/8, prefill 1..8k tokens, decode batch 1..64 at two context lengths), with their call
    counts over full-depth steps (or `num_layers` deep), most-called first."""
    dims_cache: dict[str, DecoderDims] = {}

    def steps():
        for scenario in scenario_list if scenario_list is not None else scenarios():
            if scenario.model not in dims_cache:
                dims_cache[scenario.model] = load_model_dims(models_path, scenario.model)
            dims = rank_dims(dims_cache[scenario.model], scenario.tp)
            yield scenario.label, scenario_queries(dims, scenario, dtype, attention,
                                                   num_layers or dims.num_hidden_layers)
    return merge_scenario_queries(steps())


# --- answering ----------------------------------------------------------------------------------------------

ExactLookup = Callable[[Path, str, list, TensorSpec | None], tuple[float | None, str]]
InterpolateLookup = Callable[[Path, Query], Interpolation]


@dataclass(frozen=True)
class Answer:
    """How the runtime answers one recorded query: EXACT, ZERO_COST (op_mapping says no kernel runs),
    INTERPOLATED (legally), ILLEGAL (interpolated across buckets), MISS (roofline fallback), DTYPE_UNMAPPED (a
    roofline fallback no database can prevent: the query carries a dtype the runtime cannot spell), RAISES or
    UNMODELLED (a runtime path opperf's model does not follow)."""

    recorded: RecordedQuery
    status: AnswerStatus
    latency_us: float | None
    reason: str


@functools.lru_cache(maxsize=8)
def _database_tables(database_dir: str) -> tuple[dict, dict]:
    from opperf.consumer.runtime import load_database

    return load_database(database_dir)


def modelled_exact_lookup(database_dir: str | Path, op_name: str, tensor_inputs: Sequence[TensorSpec],
                          output: TensorSpec | None) -> tuple[float | None, str]:
    """`answer`'s exact lookup from opperf's model of the runtime's exact path (`opperf.consumer.runtime.find`):
    zero_cost/accepted_miss entries answer 0; query modes that model does not cover answer None."""
    from opperf.consumer.runtime import RuntimeQuery, answered_latency, find

    mappings, tables = _database_tables(str(database_dir))
    mapping = mappings.get(op_name)
    if mapping is None:
        return None, "unmapped"
    if not _skips_zero_cost(mapping) and (mapping.get("zero_cost") or mapping.get("accepted_miss")):
        return 0.0, "zero_cost" if mapping.get("zero_cost") else "accepted_miss"
    spelled = [(tuple(s.shape), query_dtype(s.dtype)) for s in tensor_inputs]
    if any(dtype is None for _, dtype in spelled):
        return None, "an input dtype has no spelling in the runtime's DTYPE_MAP"
    out = None if output is None else (tuple(output.shape), query_dtype(output.dtype, str(output.dtype)))
    query = RuntimeQuery(tuple(spelled), out)
    hit = find(tables, mapping, query)
    if hit is None:
        return None, "no row matches"
    kernel_type, row = hit
    return answered_latency(tables, mapping, query, hit), f"{kernel_type}.csv line {row + 2}"


def _skips_zero_cost(mapping: dict) -> bool:
    """The runtime reaches its zero_cost/accepted_miss branch only for entries without these keys."""
    return bool(mapping.get("composite") or mapping.get("category") == "communication" or mapping.get("query_mode"))


def unspelled_dtypes(query: Query, mapping: dict | None = None) -> str:
    """The dtypes of `query` that msmodeling's DTYPE_MAP cannot spell (complex64 from a complex rotary `mul`,
    float64), among the tensors its lookup compares (the inputs; the output too in `query_mode: elementwise`):
    `complex64 (inputs 0, 1)`; '' when it can spell them all. The runtime turns such a tensor's dtype into None,
    matches no row and falls back to its roofline model, whatever the database holds."""
    compared = [(f"input {i}", t.dtype) for i, t in enumerate(query.inputs)]
    if (mapping or {}).get("query_mode") == "elementwise" and query.outputs:
        compared.append(("output 0", query.outputs[0].dtype))
    slots: dict[str, list[str]] = {}
    for slot, dtype in compared:
        if query_dtype(dtype) is None:
            slots.setdefault(str(dtype).removeprefix("torch."), []).append(slot)
    return "; ".join(f"{dtype} ({_slot_list(names)})" for dtype, names in slots.items())


def _slot_list(slots: Sequence[str]) -> str:
    """['input 0', 'input 1', 'output 0'] -> `inputs 0, 1, output 0`."""
    by_kind: dict[str, list[str]] = {}
    for slot in slots:
        kind, index = slot.split()
        by_kind.setdefault(kind, []).append(index)
    return ", ".join(f"{kind}{'s' if len(indices) > 1 else ''} {', '.join(indices)}"
                     for kind, indices in by_kind.items())


def mark_dtype_unmapped(answers: Sequence[Answer], operator_mappings: dict) -> list[Answer]:
    """Each MISS whose query carries a dtype the runtime cannot spell as DTYPE_UNMAPPED: the same roofline price,
    but no row could have answered it, so it says nothing about the database (check and predict name it apart)."""
    marked = []
    for item in answers:
        query = item.recorded.query
        unspelled = (unspelled_dtypes(query, operator_mappings.get(query.op_name))
                     if item.status == AnswerStatus.MISS else "")
        marked.append(Answer(item.recorded, AnswerStatus.DTYPE_UNMAPPED, None,
                             f"{unspelled}: no spelling in the runtime's DTYPE_MAP, so it never finds a row and "
                             f"prices the call at its roofline") if unspelled else item)
    return marked


def answer(queries: Sequence[RecordedQuery], database_dir: str | Path, exact_lookup: ExactLookup,
           interpolate: InterpolateLookup | None = None, database: Database | None = None) -> list[Answer]:
    """Each query as the runtime answers it from `database_dir`: `exact_lookup(database_dir, op_name,
    tensor_inputs, output) -> (latency_us or None, reason)` first (tensor_inputs: (shape, torch dtype) pairs),
    then, on a miss, `interpolate(database_dir, query)` (default: `opperf.consumer.interpolation` on `database`,
    the directory's, loaded here unless the caller has it already)."""
    database_dir = Path(database_dir)
    database = database or Database.load(database_dir)
    if interpolate is None:
        def interpolate(_directory, query):
            return database.interpolate(query)
    mappings = database.op_mapping.get("operator_mappings") or {}
    answers = []
    for recorded in queries:
        query = recorded.query
        try:
            latency, reason = exact_lookup(database_dir, query.op_name, list(query.inputs), query.output)
        except Exception as exc:   # the runtime raising stops a model run: that is the answer
            answers.append(Answer(recorded, AnswerStatus.RAISES, None,
                                  f"exact lookup raises {type(exc).__name__}: {exc}"))
            continue
        if latency is not None:
            mapping = mappings.get(query.op_name) or {}
            zero = (latency == 0 and not _skips_zero_cost(mapping)
                    and bool(mapping.get("zero_cost") or mapping.get("accepted_miss")))
            answers.append(Answer(recorded, AnswerStatus.ZERO_COST if zero else AnswerStatus.EXACT, float(latency),
                                  reason))
            continue
        result = interpolate(database_dir, query)
        hint = (" (a view: zero_cost in op_mapping answers it)" if recorded.view and result.status == AnswerStatus.MISS
                else "")
        answers.append(Answer(recorded, AnswerStatus(result.status), result.latency_us,
                              f"exact: {reason}; interpolation: {result.reason}{hint}"))
    return mark_dtype_unmapped(answers, mappings)


def answer_summary(answers: Sequence[Answer]) -> dict[str, dict[str, int]]:
    """Per status: distinct queries and calls; per op name: the statuses of its queries."""
    by_status = {s: {"queries": 0, "calls": 0} for s in AnswerStatus}
    by_op: dict[str, Counter] = {}
    for item in answers:
        by_status[item.status]["queries"] += 1
        by_status[item.status]["calls"] += item.recorded.calls
        by_op.setdefault(item.recorded.query.op_name, Counter())[item.status] += 1
    return {"by_status": by_status, "by_op": {op: dict(c) for op, c in sorted(by_op.items())}}


def manifest_records(recorded: Sequence[RecordedQuery]) -> list[dict]:
    """The queries as the density standard's query manifest lines: one JSON object per distinct query."""
    def tensors(specs):
        return [{"shape": list(s.shape), "dtype": str(s.dtype).removeprefix("torch.")} for s in specs]

    return [{"workload_id": "; ".join(r.scenarios), "calls": r.calls, "view": r.view,
             "query": {"op_name": r.query.op_name, "inputs": tensors(r.query.inputs),
                       "outputs": tensors(r.query.outputs)}} for r in recorded]


def write_query_manifest(path: str | Path, recorded: Sequence[RecordedQuery]) -> None:
    """Write `manifest_records` as JSON Lines, atomically."""
    import json

    from opperf.io import write_text_atomic

    write_text_atomic(path, "".join(json.dumps(line, sort_keys=True) + "\n" for line in manifest_records(recorded)))
