"""A real framework's model as the workload: a HuggingFace transformers causal LM built from its `config.json`.

Random weights (`AutoModelForCausalLM.from_config`: nothing is downloaded), the config's own architecture
(dense, MoE, shared experts, whatever transformers implements for its `model_type`), sdpa attention (eager where
the class has none), the KV cache transformers manages (`past_key_values`). Users do not profile our reference
decoder: they profile their model in their framework, with ops nobody wrote a replay definition for; this is that
case on any host, cpu included. transformers is an optional dependency (`pip install -e '.[transformers]'`),
imported only here.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from opperf.errors import OpperfError
from opperf.log import get_logger
from opperf.model_names import closest_config_path
from opperf.workload import tensor_cast_experts
from opperf.workload.model import WRITTEN_CONTEXT, WrittenCache, random_state

log = get_logger("workload")

CONFIG_NAME = "config.json"


def read_config(path: str | Path, num_layers: int | None = None) -> dict:
    """A model's config.json (the file or its directory) as a dict, with `num_hidden_layers` overridden; lists that
    have one entry per layer (layer_types, mlp_only_layers …) are cut to match."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_NAME
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        closest = closest_config_path(path) if isinstance(exc, FileNotFoundError) else None
        raise OpperfError(f"cannot read the model config: {exc.strerror}"
                          + (f"; closest: {closest}" if closest else ""), path=path) from exc
    except json.JSONDecodeError as exc:
        raise OpperfError(f"not valid JSON: {exc.msg}", path=path, row=exc.lineno) from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise OpperfError("a transformers config.json needs a `model_type` (e.g. \"mixtral\")", path=path,
                          field="model_type")
    if num_layers is not None:
        if num_layers < 1:
            raise OpperfError(f"must be >= 1, got {num_layers}", field="--num-layers")
        config = cut_layers(config, num_layers)
    return config


def cut_layers(config: dict, num_layers: int) -> dict:
    """The config with `num_hidden_layers` set; lists that have one entry per layer (layer_types,
    mlp_only_layers …) cut to match (in place; returned)."""
    original = config.get("num_hidden_layers")
    config["num_hidden_layers"] = num_layers
    for key, value in list(config.items()):
        if isinstance(value, list) and original and len(value) == original:
            config[key] = value[:num_layers]
    if isinstance(config.get("mlp_only_layers"), list):
        config["mlp_only_layers"] = [i for i in config["mlp_only_layers"] if i < num_layers]
    return config


def attention_implementation(transformers, hf_config) -> str:
    """sdpa, as serving runs attention, where the model class supports it; else transformers' own `eager` (Gemma-2's
    logit soft-capping, GPT-OSS's attention sinks and the pure state-space models have no sdpa path), said in the
    log and recorded in workload.json, so such a model is profiled rather than refused."""
    model_class = transformers.AutoModelForCausalLM._model_mapping.get(type(hf_config), None)
    if model_class is None or getattr(model_class, "_supports_sdpa", True):
        return "sdpa"
    log.warning("%s has no sdpa attention in transformers %s: profiling its eager attention", model_class.__name__,
                transformers.__version__)
    return "eager"


def hf_config_of(config: dict, path: str | Path = ""):
    """(the transformers module, its config object for `config`), or a clear error without transformers or for a
    model_type it cannot build."""
    try:
        import transformers
    except ImportError as exc:
        raise OpperfError("a transformers config needs the transformers package (pip install -e "
                          "'.[transformers]')", path=path) from exc
    fields = {k: v for k, v in config.items() if k not in ("model_type", "architectures", "transformers_version",
                                                           "torch_dtype", "dtype")}
    try:
        return transformers, transformers.AutoConfig.for_model(config["model_type"], **fields)
    except (ValueError, KeyError) as exc:
        raise OpperfError(f"transformers {transformers.__version__} cannot build model_type "
                          f"{config.get('model_type')!r}: {exc}", path=path, field="model_type") from exc


# The cache layers (transformers.cache_utils) whose state written_kv_cache writes: attention layers, whose keys and
# values grow with the context, and linear-attention (recurrent) layers, whose state keeps its size. A layer of
# another kind (static, quantised, indexed, compressed: DeepSeek-V4's ...) holds state of the context that update()
# alone does not write. MiniMaxCache adds per-layer recurrent states (`linear_cache`) of a fixed size.
WRITABLE_CACHE_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer", "LinearAttentionLayer",
                         "LinearAttentionAndFullAttentionLayer", "LinearAttentionAndSlidingWindowAttentionLayer")
WRITABLE_CACHES = ("DynamicCache", "MiniMaxCache")
CHUNK_SCORES = 1 << 27     # most attention scores (batch x heads x chunk x context) one chunk of a prefill may hold


def written_kv_cache(model, batch: int, context: int, generator: torch.Generator | None = None) -> tuple[object, str]:
    """(the KV cache of a transformers causal LM for `batch` sequences holding `context` tokens, how it was made).
    Not by a prefill of the context, whose eager attention holds [batch, heads, context, context] scores: a
    one-token forward makes the model's own cache (each attention layer's key/value shapes, MLA's included; a
    recurrent layer's state), then each attention layer's `update()` appends `context - 1` positions of random keys
    and values (random_state), so the cache counts `context` tokens and the next step's positions follow them.
    A cache holding layers update() does not fill (WRITABLE_CACHE_LAYERS) gets the other positions from a prefill
    in chunks whose scores stay within CHUNK_SCORES (one chunk on meta)."""
    import transformers

    device = model.get_input_embeddings().weight.device
    ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
    cache = getattr(model(input_ids=ids, use_cache=True, logits_to_keep=1), "past_key_values", None)
    if not isinstance(cache, transformers.Cache):
        raise OpperfError(f"{type(model).__name__} returns no transformers Cache (past_key_values: "
                          f"{type(cache).__name__}) to decode over; profile it with decode steps 0",
                          field="decode_steps")
    others = sorted({type(layer).__name__ for layer in cache.layers} - set(WRITABLE_CACHE_LAYERS)
                    | ({type(cache).__name__} - set(WRITABLE_CACHES)))
    if others:
        heads = int(getattr(model.config.get_text_config(), "num_attention_heads", 1) or 1)
        chunk = context if device.type == "meta" else max(1, CHUNK_SCORES // (batch * heads * context))
        for start in range(1, context, chunk):
            ids = torch.zeros(batch, min(chunk, context - start), dtype=torch.long, device=device)
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return cache, (f"computed before the profile by a one-token forward and a prefill of the other "
                       f"decode_context - 1 tokens in chunks of {chunk} (its {', '.join(others)} hold state of the "
                       "context that update() does not write)")
    for index, layer in enumerate(cache.layers):
        keys = getattr(layer, "keys", None)
        if context > 1 and isinstance(keys, torch.Tensor) and keys.numel():      # not a recurrent or shared layer
            written = [random_state((*state.shape[:-2], context - 1, state.shape[-1]), state.dtype, state.device,
                                    generator) for state in (keys, layer.values)]
            cache.update(*written, index)
    return cache, (f"{WRITTEN_CONTEXT} (the model's own cache from an unprofiled one-token forward, the other "
                   "decode_context - 1 positions appended through its update())")


def _copied(attributes: dict) -> dict:
    """An object's attributes with the lists and dicts among them copied: a decode step appends to them or assigns
    into them."""
    return {name: copy.copy(value) if isinstance(value, (list, dict)) else value for name, value in attributes.items()}


class WrittenTransformersCache(WrittenCache):
    """A transformers cache as written_kv_cache made it: a decode step grows it in place, so `decoding()` puts back,
    after the steps, what they reassigned (each layer's keys and values, its token count, the recurrent states'
    dicts). A recurrent state a step copies into keeps the last step's values, in its shape, all a step's kernels
    depend on."""

    def __init__(self, cache, how: str):
        super().__init__(cache, how)
        self._written = [(obj, _copied(vars(obj))) for obj in (cache, *cache.layers)]

    @contextlib.contextmanager
    def decoding(self):
        try:
            yield self.cache
        finally:
            for obj, attributes in self._written:
                vars(obj).clear()
                vars(obj).update(_copied(attributes))


class TransformersCausalLM:
    """The workload interface of `ReferenceDecoder` (forward(ids, start, cache) → logits, cache) over a
    transformers model. `attention` names the attn_implementation where not the default (the paged step's,
    opperf.workload.paged_step); `experts` a MoE model's experts_implementation where not transformers' choice
    (grouped_mm where torch can run it; `tensor_cast` runs msmodeling's MoE graph: opperf.workload.tensor_cast_experts)."""

    def __init__(self, config: dict, device: str, dtype: torch.dtype, seed: int = 0, path: str | Path = "",
                 attention: str | None = None, experts: str | None = None):
        transformers, hf_config = hf_config_of(config, path)
        attention = attention or attention_implementation(transformers, hf_config)
        if experts == tensor_cast_experts.NAME:
            tensor_cast_experts.register()
        torch.manual_seed(seed)
        with torch.device(device):
            self.model = transformers.AutoModelForCausalLM.from_config(
                hf_config, dtype=dtype, attn_implementation=attention,
                **({"experts_implementation": experts} if experts else {}))
        self.model.eval()
        self.config = hf_config
        self.device, self.dtype = device, dtype
        self.vocab_size = int(hf_config.vocab_size)
        self.description = {"source": "transformers", "transformers": transformers.__version__,
                            "model_class": type(self.model).__name__, "attn_implementation": attention,
                            "experts_implementation": getattr(self.model.config, "_experts_implementation", None),
                            "kv_cache": {"kind": "dynamic"}, "config": config}

    def new_cache(self):
        return None                      # transformers creates its DynamicCache on the first forward

    @torch.inference_mode()
    def written_cache(self, batch: int, context: int, generator: torch.Generator | None = None
                      ) -> WrittenTransformersCache:
        """The KV cache of `batch` sequences holding `context` tokens, written (written_kv_cache)."""
        return WrittenTransformersCache(*written_kv_cache(self.model, batch, context, generator))

    def prepare_rope(self, max_positions: int) -> None:
        """transformers computes rotary tables itself."""

    @torch.inference_mode()
    def forward(self, token_ids: torch.Tensor, start_position: int, cache):
        """One prefill (no cache) or decode step over `cache`; logits of the last position only, as serving does."""
        output = self.model(input_ids=token_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        # Mamba2 before transformers 5.24 returns its cache as `cache_params`.
        returned = getattr(output, "past_key_values", None)
        return output.logits, returned if returned is not None else getattr(output, "cache_params", None)


@dataclass(frozen=True)
class ExpertLayout:
    """A MoE model's experts as transformers builds them (its expert weights' shapes), whatever its config calls
    them: Mixtral's `num_local_experts` x `intermediate_size`, OLMoE's `num_experts` x `intermediate_size`,
    Qwen2-MoE's `moe_intermediate_size` and `shared_expert_intermediate_size`, DeepSeek's `n_routed_experts` and
    `n_shared_experts` …"""

    num_experts: int                  # routed experts of one MoE layer
    intermediate_size: int            # each routed expert's width
    experts_per_token: int            # the router's top-k
    shared_intermediate_size: int     # the width of the shared expert(s) beside them; 0 without
    dense_layers: int                 # decoder layers without experts (they run a dense MLP)


def expert_layout(config: dict, path: str | Path = "") -> ExpertLayout | None:
    """The experts of the model transformers builds from `config` (on meta: no memory, nothing computed), or None
    for a model without any.

    An experts module holds 3-D weights, one slice per expert (transformers >= 5: `gate_up_proj`, `down_proj`,
    plain or transposed); its width is the smallest of their dims other than the hidden size (`down_proj`'s). The
    top-k is the `top_k` of its MoE block's router, the config's `num_experts_per_tok` where none has one; a shared
    expert is a module beside the experts with linear layers, its width that of the one back to the hidden size."""
    return _expert_layout(json.dumps(config, sort_keys=True), str(path))


@functools.lru_cache(maxsize=16)
def _expert_layout(config_text: str, path: str) -> ExpertLayout | None:
    config = json.loads(config_text)
    transformers, hf_config = hf_config_of(config, path)
    try:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
    except Exception as exc:           # transformers' own checks of a config: ValueError, TypeError, AttributeError …
        raise OpperfError(f"transformers {transformers.__version__} cannot build this model_type "
                          f"{config.get('model_type')!r}: {exc}", path=path) from exc
    hidden = int(model.get_input_embeddings().weight.shape[-1])
    layouts = set()
    moe_layers = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            continue
        weights = [p.shape for p in module.parameters(recurse=False) if p.dim() == 3 and hidden in p.shape[1:]]
        if not weights:
            continue
        width = min(min((d for d in shape[1:] if d != hidden), default=hidden) for shape in weights)
        block = model.get_submodule(name.rpartition(".")[0])
        top_k = next((m.top_k for m in block.modules() if isinstance(getattr(m, "top_k", None), int)),
                     config.get("num_experts_per_tok") or 0)
        shared = sum(_down_projection_width(child, hidden) for child in block.children() if child is not module)
        layouts.add((int(weights[0][0]), width, int(top_k), shared))
        moe_layers += 1
    if not layouts:
        return None
    if len(layouts) > 1:
        raise OpperfError(f"the model's MoE layers hold experts of different shapes (experts, width, top-k, shared "
                          f"width: {sorted(layouts)}); the grid describes one layout per model", path=path)
    (num_experts, width, top_k, shared), = layouts
    if not top_k:
        raise OpperfError(f"the MoE blocks of model_type {config.get('model_type')!r} name no top-k: set "
                          "num_experts_per_tok", path=path, field="num_experts_per_tok")
    layers = int(getattr(hf_config.get_text_config(), "num_hidden_layers", 0) or moe_layers)
    return ExpertLayout(num_experts, width, top_k, shared, max(0, layers - moe_layers))


def _down_projection_width(module: torch.nn.Module, hidden: int) -> int:
    """The width of an MLP (a shared expert): the input of its linear layer back to the hidden size; 0 for a module
    of fewer than two linear layers (a router, a gate of one output)."""
    linears = [m for m in module.modules() if isinstance(m, torch.nn.Linear)]
    if len(linears) < 2:
        return 0
    return next((m.in_features for m in linears if m.out_features == hidden), 0)
