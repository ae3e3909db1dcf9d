"""The queries msmodeling's own runner issues for a model over a scenario space, and the database rows for them.

`record_model_queries` runs msmodeling's `ModelRunner` (opperf/consumer/msmodeling_record.py, in msmodeling's
Python) once per scenario, every scenario in one process: msmodeling's start-up (its imports, ~8 s) is paid once,
not per scenario. `rows_from_calls` lays one row per distinct query, in opperf's contract columns:

- `tensor_cast.attention` → kernel type `PagedAttention`, `tensor_cast.reshape_and_cache` → `ReshapeAndCache`: the
  call's slots as the runner issues them, and its sequence lengths, heads and block size in the `Runtime …` columns
  msmodeling's attention lookup and opperf's replay read (docs/msmodeling.md, "What its runtime reads").
- `tensor_cast.moe_gating_top_k_softmax` → `MoeGatingTopK`, `tensor_cast.init_routing_v2` → `MoeTokenPermute`,
  `tensor_cast.unpermute_tokens` → `MoeTokenUnpermute`: the call's slots as the runner issues them (the gating's k in
  `Input Scalars`), and for the permutes the experts the ids route over in `Runtime num_experts`, from the step's
  router call (`expert_count`).
- every other op (aten: mm, the rotary index_select and cat, the RMSNorm's float32 ops, …) as the grid lays a
  consumer query (opperf.grid.queries.query_rows): one row per distinct query, every schema argument, the call's
  strides, under the kernel type named after its op. Views run no kernel and get no row.

TensorCast builds in float16, which msmodeling's runtime spells `DT_BF16` as it does bfloat16: a float16 call's
row is bfloat16 (replayed in bfloat16); float32 stays float32.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from opperf.consumer.moe_routing import RUNTIME_NUM_EXPERTS
from opperf.consumer.msmodeling_env import Msmodeling, find_msmodeling, model_directory, runner_options
from opperf.consumer.msmodeling_record import SCENARIO_OPTIONS, rebuild
from opperf.contract import (ACCELERATOR_CORE, CONSUMER_QUERY, INPUT_DTYPES, INPUT_FORMATS, INPUT_SCALARS, INPUT_SHAPES,
                             OP_STATE, OUTPUT_DTYPES, OUTPUT_FORMATS, OUTPUT_SHAPES, SOURCE, SOURCE_GENERATED,
                             format_shape)
from opperf.errors import OpperfError
from opperf.log import get_logger
from opperf.parse.fia_metadata import (RUNTIME_AVG_SEQ_LEN, RUNTIME_BLOCK_SIZE, RUNTIME_INPUT_LAYOUT,
                                       RUNTIME_NUM_HEADS, RUNTIME_NUM_KEY_VALUE_HEADS, RUNTIME_SEQ_LENGTHS_KV_VALUES,
                                       RUNTIME_SEQ_LENGTHS_VALUES, RUNTIME_SPARSE_MODE, runtime_payload)
from opperf.consumer.scenarios import ScenarioSpace, parse_scenario_text

log = get_logger("consumer")

RECORDER = Path(__file__).with_name("msmodeling_record.py")
ANSWERER = Path(__file__).with_name("msmodeling_answer.py")
ATTENTION_OP = "tensor_cast.attention.default"
CACHE_WRITE_OP = "tensor_cast.reshape_and_cache.default"
PAGED_ATTENTION = "PagedAttention"
RESHAPE_AND_CACHE = "ReshapeAndCache"
GATING_OP = "tensor_cast.moe_gating_top_k_softmax.default"
PERMUTE_OP = "tensor_cast.init_routing_v2.default"
UNPERMUTE_OP = "tensor_cast.unpermute_tokens.default"
MOE_ROUTING_TYPES = {GATING_OP: "MoeGatingTopK", PERMUTE_OP: "MoeTokenPermute", UNPERMUTE_OP: "MoeTokenUnpermute"}
# msmodeling's attention lookup filters rows by decode batch with this column where a table has it.
RUNTIME_BATCH_SIZE = "Runtime batch_size"
# The dtype of a tensor_cast op's slot as msmodeling's runtime spells it (its DTYPE_MAP): float16 is DT_BF16 there.
RUNTIME_SPELLING = {"float16": "DT_BF16", "bfloat16": "DT_BF16", "float32": "FLOAT", "int64": "INT64",
                    "int32": "INT32", "int8": "INT8", "bool": "BOOL"}
AS_RECORDED = {"float16": "bfloat16"}          # a float16 call's row is bfloat16
# Options record_model_queries sets from its own arguments.
_OWN_OPTIONS = ("--device", "--num-devices", "--num-hidden-layers-override", "--tp-size", "--quantize-linear-action")


@dataclass
class ScenarioCalls:
    """The calls msmodeling's runner issued for one scenario: each {"op", "args", "kwargs", "out", "view",
    "count" (per step at the layers run), "full_depth_count" (per step at the model's own depth, or None where
    it cannot be derived)}."""

    name: str                       # prefill:64, decode:4x512
    msmodeling_args: list[str]      # its text-generate arguments after the model
    calls: list[dict]
    between_points: bool = False    # recorded between a scenario space's points (ScenarioSpace.between_points)


@dataclass
class ModelQueries:
    """What record_model_queries recorded, and with which msmodeling."""

    model: str
    msmodeling_commit: str | None
    msmodeling_commit_source: str   # git | SNAPSHOT.md | unknown
    msmodeling_args_common: list[str]
    device: str
    layers: int | None              # --num-hidden-layers-override (None: the model's own depth)
    depth: int | None               # the model's own depth (config.json num_hidden_layers)
    scenarios: list[ScenarioCalls] = field(default_factory=list)


def scenario_texts(space: ScenarioSpace) -> list[str]:
    """A scenario space's points as scenario texts, in its own order (prefill, then decode context by context)."""
    return ([f"prefill:{tokens}" for tokens in space.prefill_tokens]
            + [f"decode:{batch}x{context}" for context in space.decode_contexts for batch in space.decode_batches])


def _model_depth(config: dict) -> int | None:
    for candidate in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        if isinstance(candidate.get("num_hidden_layers"), int):
            return candidate["num_hidden_layers"]
    return None


def record_model_queries(install: Msmodeling | None, model_dir_or_config: str | Path,
                         scenarios: Sequence[str] | ScenarioSpace, *, layers: int | None = 2, tp: int = 1,
                         quantize_linear: str = "DISABLED", device: str = "TEST_DEVICE",
                         device_profile: str | Path | None = None, extra_args: Sequence[str] = (),
                         timeout_s: float | None = None) -> ModelQueries:
    """The calls msmodeling's ModelRunner issues for a model (a directory holding config.json, or a config.json
    file) at each scenario (`prefill:T`, `decode:BxC`, or a scenario space's points), one recorder process for
    all, on `tp` devices of tensor parallelism (--num-devices, --tp-size: the queries of one rank). `layers` is
    msmodeling's --num-hidden-layers-override (None: the model's depth); with 2 or more, each
    scenario also runs at 1 layer so each call's count at the model's own depth follows (the layers are alike).
    `device_profile`: a DeviceProfile file registering `device` (opperf.consumer.msmodeling_device)."""
    install = install or find_msmodeling()
    if install is None:
        raise OpperfError("no msmodeling checkout: set OPPERF_MSMODELING_DIR or lay it in ../shared/msmodeling")
    texts = scenario_texts(scenarios) if isinstance(scenarios, ScenarioSpace) else [str(s).strip() for s in scenarios]
    if not texts:
        raise OpperfError("no scenario to record", field="scenarios")
    for text in texts:
        try:
            parse_scenario_text(text)
        except OpperfError as exc:
            raise OpperfError(exc.reason, field="scenarios") from None
    twice = [text for text, count in Counter(texts).items() if count > 1]
    if twice:
        raise OpperfError(f"scenario {twice[0]} is given twice", field="scenarios")
    clash = [a for a in extra_args if str(a).split("=", 1)[0] in (*SCENARIO_OPTIONS, *_OWN_OPTIONS)]
    if clash:
        raise OpperfError(f"{clash[0]} is set by record_model_queries itself (scenarios, layers, tp, "
                          "quantize_linear, device), not by extra_args", field="extra_args")
    if layers is not None and layers < 1:
        raise OpperfError(f"layers must be >= 1 or None (the model's own depth), got {layers}", field="layers")

    from opperf.model_names import config_model_name
    from opperf.workload.transformers_model import CONFIG_NAME, read_config

    path = Path(model_dir_or_config)
    config_path = path / CONFIG_NAME if path.is_dir() else path
    config = read_config(config_path)
    with tempfile.TemporaryDirectory(prefix="opperf-msmodeling-") as work:
        common = [str(model_directory(path, work)), *runner_options(device, tp, quantize_linear, layers),
                  *map(str, extra_args)]
        output = Path(work) / "queries.json"
        command = [install.python, str(RECORDER), str(install.directory), "--output", str(output)]
        if device_profile is not None:
            command += ["--device-profile", str(device_profile)]
        for text in texts:
            command += ["--scenario", text]
        if layers is not None and layers >= 2:
            command.append("--one-layer-counts")
        done = subprocess.run([*command, "--", *common], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise OpperfError(f"msmodeling's runner failed recording {path.name} (exit {done.returncode})\n{tail}",
                              path=install.directory)
        document = json.loads(output.read_text(encoding="utf-8"))

    depth = _model_depth(config)
    recorded = [ScenarioCalls(s["name"], s["msmodeling_args"][len(common):],
                              [_with_full_depth(call, layers, depth) for call in s["calls"]])
                for s in document["scenarios"]]
    if layers is not None and (layers == 1 or depth is None):
        log.warning("%s: calls counted at %s layer(s) only (%s)", path.name, layers,
                    "no num_hidden_layers in its config" if depth is None else "a 1-layer run has no per-layer count")
    return ModelQueries(model=config_model_name(config_path), msmodeling_commit=install.commit,
                        msmodeling_commit_source=install.commit_source,
                        msmodeling_args_common=document["msmodeling_args_common"][1:], device=document["device"],
                        layers=layers, depth=depth, scenarios=recorded)


def _with_full_depth(call: dict, layers: int | None, depth: int | None) -> dict:
    """The call with its count per step at the model's own depth: from its counts at `layers` and at 1 layer
    (those of the first layer, the embedding and the head, plus one layer's per further layer), as
    opperf.consumer.queries.scenario_queries derives them."""
    full = None
    if layers is None:
        full = call["count"]
    elif depth is not None and layers >= 2 and "count_one_layer" in call:
        per_layer, left = divmod(call["count"] - call["count_one_layer"], layers - 1)
        if not left and call["count_one_layer"] + (depth - 1) * per_layer >= 0:
            full = call["count_one_layer"] + (depth - 1) * per_layer
    return {**{k: v for k, v in call.items() if k != "count_one_layer"}, "full_depth_count": full}


# --- rows ---------------------------------------------------------------------------------------------------


def rows_from_calls(recorded: ModelQueries | Sequence[ScenarioCalls], accelerator_core: str, estimator=None):
    """One generated row per distinct query of the recorded scenarios, per kernel type (opperf.grid.queries.
    QueryRows): PagedAttention and ReshapeAndCache for TensorCast's paged-cache ops, MoeGatingTopK, MoeTokenPermute
    and MoeTokenUnpermute for its MoE routing ops, the grid's consumer-query rows for the rest; a tensor_cast op of
    another kind, a permute whose expert count no router call of its step gives, or an op this torch does not have,
    is counted in `not_laid_out`. `estimator`: drop rows over the device's memory (grid.memory.MemoryEstimator)."""
    import torch

    from opperf.consumer.queries import merge_scenario_queries, profiler_args, query_of
    from opperf.grid.queries import _fits, query_rows

    scenarios = recorded.scenarios if isinstance(recorded, ModelQueries) else list(recorded)
    paged: dict[str, dict[tuple, dict]] = {PAGED_ATTENTION: {}, RESHAPE_AND_CACHE: {},
                                           **{kernel_type: {} for kernel_type in MOE_ROUTING_TYPES.values()}}
    not_laid_out: Counter[str] = Counter()
    unknown: set[tuple] = set()
    steps = []
    for scenario in scenarios:
        counts: Counter = Counter()
        views: set[str] = set()
        arguments: dict = {}
        attention_calls = [c for c in scenario.calls if c["op"] == ATTENTION_OP]
        for call in scenario.calls:
            if call["op"] == ATTENTION_OP:
                row, key = paged_attention_row(call, accelerator_core, scenario.name)
                paged[PAGED_ATTENTION].setdefault(key, row)
                continue
            if call["op"] == CACHE_WRITE_OP:
                row, key = cache_write_row(call, attention_calls, accelerator_core, scenario.name)
                paged[RESHAPE_AND_CACHE].setdefault(key, row)
                continue
            if call["op"] in MOE_ROUTING_TYPES:
                laid = moe_routing_row(call, scenario.calls, accelerator_core, scenario.name)
                if laid is not None:
                    paged[MOE_ROUTING_TYPES[call["op"]]].setdefault(laid[1], laid[0])
                    continue
            func = _torch_op(torch, call["op"])
            if func is None or call["op"].startswith("tensor_cast."):
                key = (call["op"], json.dumps([call["args"], call["kwargs"]], sort_keys=True))
                if key not in unknown:
                    unknown.add(key)
                    not_laid_out[call["op"]] += 1
                continue
            args = rebuild(call["args"], torch, dtypes=AS_RECORDED)
            kwargs = {name: rebuild(value, torch, dtypes=AS_RECORDED) for name, value in call["kwargs"].items()}
            query = query_of(func, args, rebuild(call["out"], torch, dtypes=AS_RECORDED))
            counts[query] += call["count"] if call.get("full_depth_count") is None else call["full_depth_count"]
            arguments.setdefault(query, profiler_args(func, args, kwargs))
            if call.get("view"):
                views.add(query.op_name)
        steps.append((scenario.name, (counts, views, arguments)))

    result = query_rows(merge_scenario_queries(steps), accelerator_core, estimator)
    recorded_attention = [call for scenario in scenarios for call in scenario.calls if call["op"] == ATTENTION_OP]
    for call in lookup_attention_calls(recorded_attention):
        row, key = paged_attention_row(call, accelerator_core, "lookup")
        if key not in paged[PAGED_ATTENTION]:
            paged[PAGED_ATTENTION][key] = row
            result.lookup_rows[PAGED_ATTENTION] = result.lookup_rows.get(PAGED_ATTENTION, 0) + 1
    for kernel_type, rows in paged.items():
        result.queries += len(rows) - result.lookup_rows.get(kernel_type, 0)
        kept = [row for row in rows.values() if estimator is None or _fits(row, estimator)]
        result.over_hbm_budget += len(rows) - len(kept)
        if kept:
            result.rows[kernel_type] = kept
    result.queries += sum(not_laid_out.values())
    for op, queries in sorted(not_laid_out.items()):
        result.not_laid_out[op] = result.not_laid_out.get(op, 0) + queries
    return result


# msmodeling answers a prefill's attention from a row of q tokens block-padded to 16 within 16 tokens of context.
PREFILL_LOOKUP_STEP = 16


def lookup_attention_calls(recorded: Sequence[dict]) -> list[dict]:
    """The tensor_cast.attention calls whose rows let msmodeling's lookup answer every scenario between the recorded
    ones (docs/msmodeling.md, "Rows where its runtime looks"), as its runner issues them, per attention of the model
    (query width, cache block, KV heads, head size, dtypes):

    - prefill: every multiple of 16 tokens up to the longest recorded prefill rounded up. A prefill of T tokens is
      answered exactly by the row of T rounded up to 16 (q tokens block-padded, context within 16).
    - decode: every batch from the smallest recorded to the largest at each recorded context. The lookup does not
      pad a decode batch to a neighbour: between two contexts it interpolates the rows of the call's own batch.

    The runner's cache has ceil(batch x (length + 1) / block) blocks (a slot for one more token per sequence) and a
    block table of ceil(length / block) columns (tensor_cast/core/input_generator.py; a test compares recorded
    calls)."""
    families: dict[tuple, dict] = {}
    for call in recorded:
        if call["args"][3] is not None:      # a mask follows the call's own shapes: no row laid from it
            continue
        query, key_cache = call["args"][0], call["args"][1]
        seq_lens = _lengths(call["args"][6], "seq_lens", call["op"], "lookup")
        query_lens = _lengths(call["args"][7], "query_lens", call["op"], "lookup")
        family = families.setdefault((tuple(query["shape"][1:]), tuple(key_cache["shape"][1:]), query["dtype"],
                                      key_cache["dtype"], call["args"][4]["dtype"]),
                                     {"template": call, "prefill": set(), "decode": set()})
        if len(seq_lens) == 1 and query_lens == seq_lens:
            family["prefill"].add(seq_lens[0])
        elif query_lens and set(query_lens) == {1} and len(set(seq_lens)) == 1:
            family["decode"].add((len(seq_lens), seq_lens[0] - 1))
    calls = []
    for family in families.values():
        template = family["template"]
        if family["prefill"]:
            top = -(-max(family["prefill"]) // PREFILL_LOOKUP_STEP) * PREFILL_LOOKUP_STEP
            calls += [attention_call(template, [tokens], [tokens])
                      for tokens in range(PREFILL_LOOKUP_STEP, top + 1, PREFILL_LOOKUP_STEP)]
        if family["decode"]:
            batches = [batch for batch, _ in family["decode"]]
            for context in sorted({context for _, context in family["decode"]}):
                calls += [attention_call(template, [context + 1] * batch, [1] * batch)
                          for batch in range(min(batches), max(batches) + 1)]
    return calls


def moe_routing_width(recorded: Sequence[ScenarioCalls]) -> tuple[int, int] | None:
    """(top_k, experts) of the MoE layers msmodeling's runner routed in the recorded scenarios (its
    init_routing_v2's ids and the step's router call, `expert_count`); None for a model without them. The widest
    where layers differ: it needs the most token counts laid (`expert_split_scenarios`)."""
    widths = set()
    for scenario in recorded:
        for call in scenario.calls:
            if call["op"] == PERMUTE_OP and len(call["args"]) > 1 and isinstance(call["args"][1], dict):
                experts = expert_count(call["args"][1], scenario.calls)
                if experts is not None:
                    widths.add((call["args"][1]["shape"][-1], experts))
    return max(widths, key=lambda width: 2 * width[1] / width[0]) if widths else None


def expert_split_scenarios(space: ScenarioSpace, top_k: int, experts: int) -> list[str]:
    """The scenarios between the space's points whose MoE calls msmodeling's lookup answers only from a row of
    their own token count: those where its layer gives an expert fewer than 2 of the tokens x top_k copies (it
    splits them evenly, the first experts one more: `get_split_sizes`). The list of per-expert token blocks it
    concatenates is then one of 0- and 1-row blocks, and the elementwise lookup keys on each block's relation to
    the output (a 1-row block broadcasts): no two token counts share a key. At 2 or more copies per expert every
    block is `other` and the count interpolates, from the first such count on: it is recorded too, the lower end
    of that regime. Prefill at every such length between the smallest and largest prefill point, decode at every
    such batch between the smallest and largest batch at the smallest context (the MoE calls do not depend on it);
    the points themselves are recorded already."""
    first_even = -(-2 * experts // top_k)         # the fewest tokens that give every expert 2 copies

    def splits(points: Sequence[int]) -> list[int]:
        return [tokens for tokens in range(min(points), max(points) + 1)
                if tokens <= first_even and tokens not in points]

    return ([f"prefill:{tokens}" for tokens in splits(space.prefill_tokens)]
            + [f"decode:{batch}x{min(space.decode_contexts)}" for batch in splits(space.decode_batches)])


def attention_call(template: dict, seq_lens: Sequence[int], query_lens: Sequence[int]) -> dict:
    """A tensor_cast.attention call of `template`'s model for sequences of these lengths (context + new tokens)
    and new tokens, its paged cache laid as msmodeling's runner lays it."""
    query, key_cache, value_cache, mask, block_table, start, lens, new = template["args"]
    block = key_cache["shape"][1]
    blocks = -(-(sum(seq_lens) + len(seq_lens)) // block)
    tokens = sum(query_lens)
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)

    def tensor(like: dict, shape: list[int], values: list[int] | None = None) -> dict:
        return {**{k: v for k, v in like.items() if k != "values"}, "shape": shape,
                **({"values": list(values)} if values is not None else {})}

    args = [tensor(query, [tokens, *query["shape"][1:]]), tensor(key_cache, [blocks, *key_cache["shape"][1:]]),
            tensor(value_cache, [blocks, *value_cache["shape"][1:]]), mask,
            tensor(block_table, [len(seq_lens), -(-max(seq_lens) // block)]),
            tensor(start, [len(starts)], starts), tensor(lens, [len(seq_lens)], seq_lens),
            tensor(new, [len(query_lens)], query_lens)]
    out = template.get("out")
    if isinstance(out, dict) and "shape" in out:
        out = tensor(out, [tokens, *out["shape"][1:]])
    return {**template, "args": args, "out": out, "count": 0, "full_depth_count": None}


def _torch_op(torch, name: str):
    """torch.ops.<namespace>.<op>.<overload> of a recorded op name, None where this torch has none."""
    value = torch.ops
    try:
        for part in name.split("."):
            value = getattr(value, part)
    except (AttributeError, RuntimeError):
        return None
    return value if isinstance(value, torch._ops.OpOverload) else None


def _slots(values: Sequence) -> tuple[str, str, str]:
    """(shapes, dtypes, formats) fields of a tensor_cast op's slots; an absent tensor (None) an empty slot."""
    shapes, dtypes, formats = [], [], []
    for value in values:
        if value is None:
            shapes.append(""), dtypes.append(""), formats.append("")
            continue
        if not isinstance(value, dict) or "shape" not in value or value.get("dtype") not in RUNTIME_SPELLING:
            raise OpperfError(f"slot {len(shapes)} is {json.dumps(value)[:80]}: not a tensor of a dtype msmodeling "
                              f"spells ({', '.join(RUNTIME_SPELLING)})")
        shapes.append(format_shape(value["shape"]))
        dtypes.append(RUNTIME_SPELLING[value["dtype"]])
        formats.append("ND")
    return ";".join(shapes), ";".join(dtypes), ";".join(formats)


def _positional(call: dict, names: Sequence[str], scenario: str) -> list:
    if call["kwargs"] or len(call["args"]) != len(names):
        raise OpperfError(f"{call['op']} with {len(call['args'])} arguments and keywords {sorted(call['kwargs'])}; "
                          f"TensorCast issues {len(names)} positional ones ({', '.join(names)})",
                          field=f"scenario {scenario}")
    return call["args"]


def _lengths(value, what: str, op: str, scenario: str) -> list[int]:
    if not isinstance(value, dict) or not isinstance(value.get("values"), list):
        raise OpperfError(f"{op}: {what} was recorded without its values (a tensor on the meta device?)",
                          field=f"scenario {scenario}")
    return [int(v) for v in value["values"]]


ATTENTION_ARGUMENTS = ("query", "key_cache", "value_cache", "attention_mask", "block_table", "query_start_loc",
                       "seq_lens", "query_lens")
CACHE_WRITE_ARGUMENTS = ("key", "value", "kv_cache", "slot_mapping")


def paged_attention_row(call: dict, accelerator_core: str, scenario: str = "") -> tuple[dict[str, str], tuple]:
    """(the PagedAttention row of a tensor_cast.attention call, its identity: slots and lengths)."""
    args = _positional(call, ATTENTION_ARGUMENTS, scenario)
    query, key = args[0], args[1]
    seq_lens = _lengths(args[6], "seq_lens", call["op"], scenario)
    query_lens = _lengths(args[7], "query_lens", call["op"], scenario)
    head_dim, kv_heads, block_size = key["shape"][-1], key["shape"][-2], key["shape"][1]
    heads = query["shape"][1] if len(query["shape"]) == 3 else query["shape"][-1] // head_dim
    shapes, dtypes, formats = _slots(args)
    out_shapes, out_dtypes, out_formats = _slots([call["out"]])
    payload = runtime_payload({"actual_seq_lengths": query_lens, "actual_seq_lengths_kv": seq_lens,
                               "num_heads": heads, "num_key_value_heads": kv_heads, "sparse_mode": 3,
                               "input_layout": "TND", "block_size": block_size})
    runtime = {RUNTIME_AVG_SEQ_LEN: str(sum(seq_lens) // len(seq_lens)),      # msmodeling's int(mean(seq_lens))
               RUNTIME_SPARSE_MODE: payload[RUNTIME_SPARSE_MODE], RUNTIME_NUM_HEADS: payload[RUNTIME_NUM_HEADS],
               RUNTIME_NUM_KEY_VALUE_HEADS: payload[RUNTIME_NUM_KEY_VALUE_HEADS],
               RUNTIME_INPUT_LAYOUT: payload[RUNTIME_INPUT_LAYOUT], RUNTIME_BATCH_SIZE: str(len(seq_lens)),
               RUNTIME_BLOCK_SIZE: payload[RUNTIME_BLOCK_SIZE],
               RUNTIME_SEQ_LENGTHS_VALUES: payload[RUNTIME_SEQ_LENGTHS_VALUES],
               RUNTIME_SEQ_LENGTHS_KV_VALUES: payload[RUNTIME_SEQ_LENGTHS_KV_VALUES]}
    row = {OP_STATE: "eager", ACCELERATOR_CORE: accelerator_core, INPUT_SHAPES: shapes, INPUT_DTYPES: dtypes,
           INPUT_FORMATS: formats, OUTPUT_SHAPES: out_shapes, OUTPUT_DTYPES: out_dtypes, OUTPUT_FORMATS: out_formats,
           **runtime, SOURCE: SOURCE_GENERATED, CONSUMER_QUERY: call["op"]}
    return row, (shapes, dtypes, out_shapes, tuple(seq_lens), tuple(query_lens))


def cache_write_row(call: dict, attention_calls: Sequence[dict], accelerator_core: str, scenario: str = ""
                    ) -> tuple[dict[str, str], tuple]:
    """(the ReshapeAndCache row of a tensor_cast.reshape_and_cache call, its identity as msmodeling looks it up: the
    new keys' shape and dtype): the step's batch and lengths from the scenario's attention call over the same cache
    and tokens where there is exactly one such."""
    args = _positional(call, CACHE_WRITE_ARGUMENTS, scenario)
    key, cache = args[0], args[2]
    shapes, dtypes, formats = _slots(args)
    steps = set()
    for attention in attention_calls:
        attention_args = attention["args"]
        if (len(attention_args) == len(ATTENTION_ARGUMENTS) and attention_args[1]["shape"] == cache["shape"][1:]
                and attention_args[0]["shape"][0] == key["shape"][0]):
            steps.add((tuple(_lengths(attention_args[6], "seq_lens", attention["op"], scenario)),
                       tuple(_lengths(attention_args[7], "query_lens", attention["op"], scenario))))
    seq_lens, query_lens = next(iter(steps)) if len(steps) == 1 else ((), ())
    row = {OP_STATE: "eager", ACCELERATOR_CORE: accelerator_core, INPUT_SHAPES: shapes, INPUT_DTYPES: dtypes,
           INPUT_FORMATS: formats, OUTPUT_SHAPES: "", OUTPUT_DTYPES: "", OUTPUT_FORMATS: "",
           RUNTIME_BATCH_SIZE: str(len(seq_lens)) if seq_lens else "", RUNTIME_BLOCK_SIZE: str(cache["shape"][2]),
           RUNTIME_SEQ_LENGTHS_VALUES: ",".join(map(str, query_lens)),
           RUNTIME_SEQ_LENGTHS_KV_VALUES: ",".join(map(str, seq_lens)),
           SOURCE: SOURCE_GENERATED, CONSUMER_QUERY: call["op"]}
    # msmodeling looks the write up by its new keys alone (ReshapeAndCache.yaml's tc_input_count): one row per
    # token count and dtype answers every cache it writes into.
    return row, (format_shape(key["shape"]), key["dtype"])


def moe_routing_row(call: dict, step_calls: Sequence[dict], accelerator_core: str, scenario: str = ""
                    ) -> tuple[dict[str, str], tuple] | None:
    """(the row of a TensorCast MoE routing call, its identity: slots, k and expert count), under the kernel type
    MOE_ROUTING_TYPES names; None for a permute or unpermute whose expert count `expert_count` cannot tell from
    the step's calls (`step_calls`): its ids could not be laid."""
    if call["op"] == GATING_OP:
        logits, top_k = _positional(call, ("x", "top_k"), scenario)
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise OpperfError(f"{call['op']}: top_k is {json.dumps(top_k)[:40]}, not an integer",
                              field=f"scenario {scenario}")
        slots, scalars, runtime = [logits, None], f";{top_k}", {}
    else:
        slots = _positional(call, ("x", "topk_indices"), scenario)
        experts = expert_count(slots[1], step_calls)
        if experts is None:
            log.warning("%s in scenario %s: no router call of the step gives the experts its ids %s route over; "
                        "no row laid", call["op"], scenario, slots[1].get("shape") if isinstance(slots[1], dict)
                        else slots[1])
            return None
        scalars, runtime = "", {RUNTIME_NUM_EXPERTS: str(experts)}
    shapes, dtypes, formats = _slots(slots)
    outputs = call["out"] if isinstance(call["out"], list) else [call["out"]]
    out_shapes, out_dtypes, out_formats = _slots(outputs)
    row = {OP_STATE: "eager", ACCELERATOR_CORE: accelerator_core, INPUT_SHAPES: shapes, INPUT_DTYPES: dtypes,
           INPUT_FORMATS: formats, OUTPUT_SHAPES: out_shapes, OUTPUT_DTYPES: out_dtypes, OUTPUT_FORMATS: out_formats,
           INPUT_SCALARS: scalars, **runtime, SOURCE: SOURCE_GENERATED, CONSUMER_QUERY: call["op"]}
    return row, (shapes, dtypes, scalars, out_shapes, tuple(runtime.values()))


def expert_count(topk_indices: dict, step_calls: Sequence[dict]) -> int | None:
    """How many experts the expert ids `topk_indices` [T, k] route over: the logits width of the step's router call
    that picked them (its int64 output of their shape): the fused gating where the model has it, else aten.topk
    (the layer's own top-k over its scores). None where no such call, or several of other widths, say."""
    if not isinstance(topk_indices, dict) or not topk_indices.get("shape"):
        return None
    shape, top_k = topk_indices["shape"], topk_indices["shape"][-1]
    for op in (GATING_OP, "aten.topk.default"):
        widths = set()
        for call in step_calls:
            outputs = call.get("out") if isinstance(call.get("out"), list) else []
            scores = call["args"][0] if call["op"] == op and call["args"] else None
            if (isinstance(scores, dict) and scores.get("shape") and scores["shape"][-1] >= top_k
                    and any(isinstance(o, dict) and o.get("dtype") == "int64" and o.get("shape") == shape
                            for o in outputs)):
                widths.add(scores["shape"][-1])
        if widths:
            return widths.pop() if len(widths) == 1 else None
    return None


# --- asking msmodeling -------------------------------------------------------------------------------------


def ask_msmodeling(install: Msmodeling, database_dir: str | Path, calls: Sequence[dict], *,
                   timeout_s: float | None = None) -> list[dict]:
    """How msmodeling's own data sources (ProfilingDataSource, wrapped in its InterpolatingDataSource as its runner
    wraps it) answer each recorded call from a database directory: {"op", "exact" (latency of an exact match, else
    None), "source", "latency_us", "method", "rule", "miss_reason", "raised"} (opperf/consumer/msmodeling_answer.py,
    run in msmodeling's Python)."""
    request = json.dumps({"database": str(database_dir), "calls": list(calls)})
    done = subprocess.run([install.python, str(ANSWERER), str(install.directory)], input=request,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        raise OpperfError(f"msmodeling's data source failed (exit {done.returncode})\n{tail}", path=database_dir)
    return json.loads(done.stdout)
