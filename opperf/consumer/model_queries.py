"""The queries of any model over a scenario space: what a performance model asks a database for a step of *its*
model, at the batches and lengths it will be asked about.

A model is a transformers `config.json` (random weights on meta: nothing is downloaded, nothing is computed) or a
`config/models.yaml` entry (the reference decoder). Each scenario of the space — a prefill of N tokens, a decode
step of B sequences over C cached tokens, at a tensor-parallel size — is one forward step run on meta tensors under
`torch.no_grad()` and a TorchDispatchMode, as msmodeling's TensorCast records a model run
(opperf.consumer.queries.QueryRecorder). Two choices the model code leaves to the device are made as the
target back end makes them: `scaled_dot_product_attention` runs the kernel that back end dispatches it to
(queries.ATTENTION_KERNELS), and a MoE router's token counts are whatever the model's experts
implementation makes of them on meta (transformers' grouped_mm path is shape-static: its rows are the same for any
split).

Tensor parallelism is a rank's share of the model, as serving stacks shard it: attention and KV heads, the MLP's
and each expert's intermediate width, and the vocabulary split `tp` ways; the hidden size and head_dim unchanged.

The scenario space (config/scenarios.yaml, opperf.consumer.scenarios) is a grid: prefill token counts, decode batches x
contexts, TP sizes.
Its points follow the density standard's grids (M_GRID for tokens, ATTN_BATCH_GRID, ATTN_SEQ_GRID), so a scenario
with at most one axis between grid points is answered EXACT or by a legal 1-D interpolation; one with two
(a decode batch and a context both between points) varies two axes of its attention rows at once, which the
standard calls illegal.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opperf.consumer.queries import (ATTENTION_KERNELS, QueryRecorder, RecordedQuery, merge_scenario_queries,
                                     rank_dims, scenario_queries)
from opperf.consumer.scenarios import Scenario, parse_scenario_option
from opperf.errors import OpperfError
from opperf.log import get_logger
from opperf.model_names import model_reference

log = get_logger("queries")

def parse_scenario(text: str, model: str, tp: int = 1) -> Scenario:
    """`prefill:TOKENS` or `decode:BATCHxCONTEXT` (opperf.consumer.scenarios.parse_scenario_text) as a Scenario of
    `model` at TP `tp`."""
    parsed = parse_scenario_option(text)
    return Scenario(model, tp, parsed.phase, parsed.batch, parsed.tokens, parsed.context)


def position_limit_warning(scenario: Scenario, max_positions: int | None) -> str | None:
    """One line when a scenario's step reaches past the positions the model was built for (its
    max_position_embeddings): the step is still recorded and answered, but no such request reaches the model."""
    positions = scenario.context + scenario.tokens
    if not max_positions or positions <= max_positions:
        return None
    return (f"{scenario_name(scenario)} reaches position {positions:,}, past the model's max_position_embeddings "
            f"{max_positions:,}: predicted as asked, but the model serves no such step")


def scenario_name(scenario: Scenario) -> str:
    """The scenario as `--scenario` spells it (with `@tpN` when sharded)."""
    text = (f"prefill:{scenario.tokens}" if scenario.phase == "prefill"
            else f"decode:{scenario.batch}x{scenario.context}")
    return text if scenario.tp == 1 else f"{text}@tp{scenario.tp}"


# --- transformers models on meta ------------------------------------------------------------------------

_SHARDED_WIDTHS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
                   "ffn_hidden_size")


def rank_config(config: dict, tp: int) -> dict:
    """One tensor-parallel rank's share of a transformers config: attention heads, KV heads (replicated once fewer
    than ranks), the MLP and expert intermediate widths and the vocabulary split `tp` ways; head_dim pinned to the
    full model's (configs that derive it from hidden_size / heads would otherwise grow it)."""
    if tp == 1:
        return dict(config)
    heads = config.get("num_attention_heads")
    if not isinstance(heads, int) or heads % tp:
        raise OpperfError(f"TP size {tp} does not divide num_attention_heads {heads}", field="tp")
    sharded = dict(config)
    sharded["head_dim"] = config.get("head_dim") or config["hidden_size"] // heads
    sharded["num_attention_heads"] = heads // tp
    kv_heads = config.get("num_key_value_heads", heads)
    sharded["num_key_value_heads"] = max(1, kv_heads // tp)
    for key in _SHARDED_WIDTHS:
        if isinstance(config.get(key), int):
            if config[key] % tp:
                raise OpperfError(f"TP size {tp} does not divide {key} {config[key]}", field="tp")
            sharded[key] = config[key] // tp
    if isinstance(config.get("vocab_size"), int):
        sharded["vocab_size"] = math.ceil(config["vocab_size"] / tp)
    return sharded


@contextlib.contextmanager
def _attention_as(attention: str):
    """`torch.nn.functional.scaled_dot_product_attention` as the target back end dispatches it (transformers looks
    it up at call time); torch's own choice when `attention` is `math` or the call has a mask or dropout. With
    `enable_gqa` the KV heads go in as they are: the fused kernels (cuDNN on an H200 for transformers' grouped-query
    attention) read them without repeating them."""
    kernel = ATTENTION_KERNELS[attention]
    if kernel is None:
        yield
        return
    original = torch.nn.functional.scaled_dot_product_attention

    def dispatched(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p:
            return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                            scale=scale, enable_gqa=enable_gqa)
        return kernel(query, key, value, is_causal=is_causal)   # enable_gqa: the fused kernels take fewer KV heads

    torch.nn.functional.scaled_dot_product_attention = dispatched
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = original


class _GroupedMmOnMeta(TorchDispatchMode):
    """A MoE step on meta in any float dtype: torch's meta kernel of `_grouped_mm` (transformers' experts path) takes
    bfloat16 only, as the CUDA kernel does, where the cpu kernel takes float32 too; the output's shape is the same,
    so it is computed in bfloat16 and given the call's dtype. The recorded query keeps the call's own dtypes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if (func is not torch.ops.aten._grouped_mm.default or args[0].device.type != "meta"
                or args[0].dtype == torch.bfloat16):
            return func(*args, **kwargs)
        args = list(args)
        out_dtype = args[4] if len(args) > 4 else kwargs.get("out_dtype")
        if len(args) > 4:
            args[4] = None
        kwargs.pop("out_dtype", None)
        cast = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        return func(*cast, **kwargs).to(out_dtype or args[0].dtype)


class MetaTransformersModel:
    """A transformers causal LM built on meta from a config dict (one per TP size and depth), stepped through a
    scenario under a QueryRecorder."""

    def __init__(self, config: dict, dtype: torch.dtype, path: str | Path = ""):
        from opperf.workload.transformers_model import attention_implementation, hf_config_of

        transformers, hf_config = hf_config_of(config, path)
        with torch.device("meta"):
            self.model = transformers.AutoModelForCausalLM.from_config(
                hf_config, dtype=dtype, attn_implementation=attention_implementation(transformers, hf_config))
        self.model.eval()
        # transformers >= 5.2x names the KV cache argument `cache` (`past_key_values` deprecated)
        parameters = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in parameters else "past_key_values"

    def step(self, scenario: Scenario, attention: str) -> QueryRecorder:
        """The queries of one forward step; a decode step's KV cache is written unrecorded, as the workload writes
        it (transformers_model.written_kv_cache; on meta: shapes only)."""
        from opperf.workload.transformers_model import written_kv_cache

        recorder = QueryRecorder()
        with torch.no_grad(), _attention_as(attention), _GroupedMmOnMeta():
            cache = {}
            if scenario.phase == "decode":
                cache = {self._cache_argument: written_kv_cache(self.model, scenario.batch, scenario.context)[0]}
            ids = torch.zeros(scenario.batch, scenario.tokens, dtype=torch.long, device="meta")
            with recorder:
                self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **cache)
        return recorder


def _layers_of(config: dict, num_layers: int) -> dict:
    from opperf.workload.transformers_model import cut_layers

    return cut_layers(dict(config), num_layers)


@dataclass(frozen=True)
class ModelSource:
    """A model the queries are recorded for: a transformers config (`config`, from `path`) or a models.yaml
    entry (`name` in `models_path`)."""

    name: str
    config: dict | None = None
    path: str = ""
    models_path: str = ""
    num_layers: int | None = None       # depth of the steps (default: the model's own)

    @property
    def depth(self) -> int:
        if self.num_layers:
            return self.num_layers
        if self.config is not None:
            return int(self.config.get("num_hidden_layers", 1))
        from opperf.workload.model import load_model_dims

        return load_model_dims(self.models_path, self.name).num_hidden_layers

    @property
    def max_positions(self) -> int | None:
        """The positions the model is built for (`max_position_embeddings`, a multimodal config's text model's
        where it has one), or None where its config names none."""
        if self.config is not None:
            text_config = self.config.get("text_config")
            for config in (self.config, text_config if isinstance(text_config, dict) else {}):
                if isinstance(config.get("max_position_embeddings"), int):
                    return config["max_position_embeddings"]
            return None
        from opperf.model_names import model_key, read_models

        models = read_models(self.models_path)
        value = models[model_key(models, self.name, path=self.models_path)].get("max_position_embeddings")
        return value if isinstance(value, int) else None

    @property
    def tp_sizes(self) -> tuple[int, ...]:
        if self.config is not None:
            return ()
        from opperf.grid.models import load_models, select_models

        return tuple(select_models(load_models(self.models_path), [self.name], path=self.models_path)[0].tp_sizes
                     or ())


def model_source(model: str, models_path: str | Path, num_layers: int | None = None) -> ModelSource:
    """A config.json path (file or directory holding one) or a name/alias of `models_path` (model_reference)."""
    from opperf.grid.models import load_models

    reference = model_reference(model, models_path)
    if reference.is_config:
        from opperf.workload.transformers_model import read_config

        return ModelSource(reference.name, read_config(reference.config_path), str(reference.config_path),
                           num_layers=num_layers)
    load_models(models_path)             # every entry checked, as the grid reads them
    return ModelSource(reference.name, models_path=str(models_path), num_layers=num_layers)


def scenario_tp_sizes(source: ModelSource, space_tp_sizes: Sequence[int], *, dtype: torch.dtype = torch.bfloat16,
                      attention: str = "cuda") -> tuple[tuple[int, ...], dict[int, str]]:
    """(the TP sizes `source`'s scenarios are recorded at, {each size of the space left out: why}). A models.yaml
    entry's own tp_sizes win over the space's. A transformers config is sharded only as far as it divides (heads, KV
    heads, the MLP and expert widths: ModelConfig.tp_size_problem) and as far as its code runs on one rank's share of
    its config (OLMoE's and OLMo-2's query norm spans every head: it does not at TP > 1)."""
    if source.config is None:
        return source.tp_sizes, {}
    from opperf.grid.models import model_from_config_json

    kept, left_out = model_from_config_json(source.path).splitting_tp_sizes(space_tp_sizes)
    record = _recorder_for(source, dtype, attention)
    for tp in kept:
        if tp == 1:
            continue
        try:
            record(Scenario(source.name, tp, "prefill", 1, 1), 1)
        except (RuntimeError, ValueError) as exc:      # the model code's own shape checks, on meta
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            left_out[tp] = (f"its code does not run on one rank's share of the config ({type(exc).__name__}: "
                            f"{first_line[:200]})")
    return tuple(tp for tp in kept if tp not in left_out), dict(sorted(left_out.items()))


def _recorder_for(source: ModelSource, dtype: torch.dtype, attention: str) -> Callable[[Scenario, int],
                                                                                      QueryRecorder]:
    """`record(scenario, layers)`: the queries of a `layers`-deep step of the scenario's TP rank."""
    if attention not in ATTENTION_KERNELS:
        raise OpperfError(f"unknown attention kernel {attention!r}; one of {sorted(ATTENTION_KERNELS)}",
                          field="attention")
    if source.config is None:
        from opperf.consumer.queries import record_step
        from opperf.workload.model import load_model_dims

        dims = load_model_dims(source.models_path, source.name)

        def record_reference(scenario: Scenario, layers: int) -> QueryRecorder:
            return record_step(replace(rank_dims(dims, scenario.tp), num_hidden_layers=layers), scenario, dtype,
                               attention)
        return record_reference

    models: dict[tuple[int, int], MetaTransformersModel] = {}

    def record_transformers(scenario: Scenario, layers: int) -> QueryRecorder:
        key = (scenario.tp, layers)
        if key not in models:
            models[key] = MetaTransformersModel(_layers_of(rank_config(source.config, scenario.tp), layers), dtype,
                                                source.path)
        return models[key].step(scenario, attention)
    return record_transformers


def model_steps(source: ModelSource, scenarios: Iterable[Scenario], *, dtype: torch.dtype = torch.bfloat16,
                attention: str = "cuda"):
    """(scenario label, scenario_queries result) of each scenario of `source`'s model: call counts over steps of the
    model's depth, from a 1-layer and a 2-layer step (the layers repeat)."""
    record = _recorder_for(source, dtype, attention)
    depth = source.depth
    for scenario in scenarios:
        yield scenario.label, scenario_queries(None, scenario, dtype, attention, depth,
                                               record=lambda layers, scenario=scenario: record(scenario, layers))


def model_queries(source: ModelSource, scenarios: Iterable[Scenario], *, dtype: torch.dtype = torch.bfloat16,
                  attention: str = "cuda") -> list[RecordedQuery]:
    """The distinct queries of every scenario of `source`'s model with their call counts (model_steps),
    most-called first; each query names the scenarios that issue it."""
    return merge_scenario_queries(model_steps(source, scenarios, dtype=dtype, attention=attention))


def step_queries(source: ModelSource, scenarios: Sequence[Scenario], *, dtype: torch.dtype = torch.bfloat16,
                 attention: str = "cuda"):
    """Each scenario with the queries of its one step and their calls per step (the model built once for all)."""
    for scenario, step in zip(scenarios, model_steps(source, scenarios, dtype=dtype, attention=attention)):
        yield scenario, merge_scenario_queries([step])
