"""Model configurations (`config/models.yaml`, Hugging Face field names) and the kernel shapes they imply.

A model contributes, per tensor-parallel (TP) size, the (N, K) pairs of its GEMMs, the per-rank attention
head layout and the elementwise widths; per expert-parallel (EP) size, its MoE expert layout. These feed
the `model.*` value grids of `config/grid.yaml` and the function generators.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opperf.model_names import ModelReference, check_distinct_names, model_reference, read_models
from opperf.yaml_files import field_error

_REQUIRED = ("hidden_size", "num_attention_heads", "vocab_size", "tp_sizes")
_POSITIVE_INTEGER_FIELDS = (
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
    "num_hidden_layers", "n_routed_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
)
_NON_NEGATIVE_INTEGER_FIELDS = ("n_shared_experts", "first_k_dense_replace")
# What a config.json's experts are is read from the model transformers builds (expert_layout), not from these keys:
# each model family names them its own way.
_EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts", "num_experts_per_tok",
                  "moe_intermediate_size", "n_shared_experts", "first_k_dense_replace")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class ModelConfig:
    """One model's dimensions (HF names) and the parallel sizes to enumerate."""

    name: str
    hidden_size: int
    num_attention_heads: int
    vocab_size: int
    tp_sizes: tuple[int, ...]
    ep_sizes: tuple[int, ...] = (1,)
    intermediate_size: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    num_hidden_layers: int = 0
    num_experts: int = 0                 # n_routed_experts (DeepSeek) or num_experts (Qwen-MoE)
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    n_shared_experts: int = 0
    first_k_dense_replace: int = 0       # dense-MLP layers of a MoE model (DeepSeek's leading ones)
    q_lora_rank: int = 0                 # MLA (DeepSeek); 0 = no query compression
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    aliases: tuple[str, ...] = ()

    # --- what the model is -------------------------------------------------------------------

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def has_dense_mlp(self) -> bool:
        """Whether some layers run a plain (TP-sharded) MLP with intermediate_size."""
        return self.intermediate_size > 0 and (not self.is_moe or self.first_k_dense_replace > 0)

    @property
    def rope_dim(self) -> int:
        return self.qk_rope_head_dim if self.is_mla else self.head_dim

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads on one rank: sharded while there are enough, replicated (1 per rank) beyond that."""
        return max(1, self.num_key_value_heads // tp)

    # --- shapes per parallel size --------------------------------------------------------------

    def gemm_projections(self, tp: int) -> list[tuple[str, int, int]]:
        """(projection, N, K) of every GEMM of one decoder rank at TP size `tp` (column/row parallel)."""
        hidden = self.hidden_size
        heads = self.num_attention_heads // tp
        out: list[tuple[str, int, int]] = []
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            kv_a = self.kv_lora_rank + self.qk_rope_head_dim
            if self.q_lora_rank:
                out += [("q_a_proj", self.q_lora_rank, hidden), ("kv_a_proj_with_mqa", kv_a, hidden),
                        ("fused_qkv_a_proj", self.q_lora_rank + kv_a, hidden),
                        ("q_b_proj", heads * qk_head, self.q_lora_rank)]
            else:
                out += [("q_proj", heads * qk_head, hidden), ("kv_a_proj_with_mqa", kv_a, hidden)]
            out += [("kv_b_proj", heads * (self.qk_nope_head_dim + self.v_head_dim), self.kv_lora_rank),
                    ("o_proj", hidden, heads * self.v_head_dim)]
        else:
            kv_heads = self.kv_heads_per_rank(tp)
            out += [("qkv_proj", (heads + 2 * kv_heads) * self.head_dim, hidden),
                    ("o_proj", hidden, heads * self.head_dim)]
        if self.has_dense_mlp:
            width = self.intermediate_size // tp
            out += [("gate_up_proj", 2 * width, hidden), ("down_proj", hidden, width)]
        if self.is_moe and self.n_shared_experts:
            width = self.moe_intermediate_size * self.n_shared_experts // tp
            out += [("shared_experts.gate_up_proj", 2 * width, hidden), ("shared_experts.down_proj", hidden, width)]
        if self.is_moe:
            out.append(("router_gate", self.num_experts, hidden))      # replicated, not sharded
        out.append(("lm_head", _ceil_div(self.vocab_size, tp), hidden))
        return out

    def mlp_widths(self, tp: int) -> list[int]:
        """Per-rank widths of the MLP activations (dense MLP, shared experts, routed experts)."""
        widths = []
        if self.has_dense_mlp:
            widths.append(self.intermediate_size // tp)
        if self.is_moe and self.n_shared_experts:
            widths.append(self.moe_intermediate_size * self.n_shared_experts // tp)
        if self.is_moe:
            widths.append(self.moe_intermediate_size)
        return widths

    def attention_layout(self, tp: int) -> tuple[int, int, int] | None:
        """(query heads, KV heads, head_dim) on one rank for standard (non-MLA) attention."""
        if self.is_mla:
            return None
        return (self.num_attention_heads // tp, self.kv_heads_per_rank(tp), self.head_dim)

    def mla_layout(self, tp: int) -> tuple[int, int, int, int, int] | None:
        """(query heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim) on one rank."""
        if not self.is_mla:
            return None
        return (self.num_attention_heads // tp, self.kv_lora_rank, self.qk_nope_head_dim,
                self.qk_rope_head_dim, self.v_head_dim)

    def expert_layout(self, ep: int) -> tuple[int, int, int, int, int] | None:
        """(EP size, experts per rank, top-k, hidden, moe_intermediate_size) at one EP size."""
        if not self.is_moe:
            return None
        return (ep, self.num_experts // ep, self.num_experts_per_tok, self.hidden_size, self.moe_intermediate_size)

    def expert_layouts(self) -> list[tuple[int, int, int, int, int]]:
        """The expert layout at every EP size."""
        return [self.expert_layout(ep) for ep in self.ep_sizes] if self.is_moe else []

    # --- which parallel sizes split it ---------------------------------------------------------

    def tp_size_problem(self, tp: int) -> str | None:
        """Why TP size `tp` does not split this model evenly, as the serving engine (and the queries' ranks) need:
        attention heads, KV heads (divided, or replicated a whole number of times), the TP-sharded MLP and expert
        widths; None where it does."""
        kv_heads = self.num_key_value_heads
        if self.num_attention_heads % tp:
            return f"TP size {tp} does not divide num_attention_heads {self.num_attention_heads}"
        if not self.is_mla and (kv_heads % tp if tp <= kv_heads else tp % kv_heads):
            return f"TP size {tp} neither divides nor is a multiple of num_key_value_heads {kv_heads}"
        if self.has_dense_mlp and self.intermediate_size % tp:
            return f"TP size {tp} does not divide intermediate_size {self.intermediate_size}"
        if self.is_moe and self.moe_intermediate_size % tp:
            return f"TP size {tp} does not divide moe_intermediate_size {self.moe_intermediate_size}"
        if self.is_moe and self.n_shared_experts and self.moe_intermediate_size * self.n_shared_experts % tp:
            return (f"TP size {tp} does not divide the shared experts' width "
                    f"{self.moe_intermediate_size * self.n_shared_experts}")
        return None

    def splitting_tp_sizes(self, sizes: Sequence[int]) -> tuple[tuple[int, ...], dict[int, str]]:
        """(the sizes of `sizes` that split this model, {each other size: why not}): a scenario space's TP sizes
        shard a model only as far as it divides."""
        problems = {tp: self.tp_size_problem(tp) for tp in sizes}
        return (tuple(tp for tp, problem in problems.items() if problem is None),
                {tp: problem for tp, problem in problems.items() if problem is not None})


def _model_from_entry(name: str, entry: object, path: Path) -> ModelConfig:
    if not isinstance(entry, dict):
        raise field_error(f"model {name!r} must be a mapping of Hugging Face config fields", path, name)

    def where(field: str) -> str:
        return f"{name}.{field}"

    missing = [f for f in _REQUIRED if f not in entry]
    if missing:
        raise field_error(f"model {name!r} lacks {missing}", path, where(missing[0]))
    values: dict[str, object] = {}
    for field in _POSITIVE_INTEGER_FIELDS + _NON_NEGATIVE_INTEGER_FIELDS:
        value = entry.get(field)
        if value is None:
            continue
        minimum = 0 if field in _NON_NEGATIVE_INTEGER_FIELDS else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise field_error(f"model {name!r}: {field} must be an integer >= {minimum}, got {value!r}", path,
                              where(field))
        values[field] = value
    num_experts = values.pop("n_routed_experts", None) or values.pop("num_experts", None) or 0
    values.pop("num_experts", None)
    heads = values["num_attention_heads"]
    values.setdefault("num_key_value_heads", heads)
    values.setdefault("head_dim", values["hidden_size"] // heads)
    for field in ("tp_sizes", "ep_sizes"):
        sizes = entry.get(field, [1])
        if (not isinstance(sizes, list) or not sizes
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes)):
            raise field_error(f"model {name!r}: {field} must be a non-empty list of positive integers, "
                              f"got {sizes!r}", path, where(field))
        values[field] = tuple(dict.fromkeys(sizes))
    aliases = entry.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise field_error(f"model {name!r}: aliases must be a list of strings", path, where("aliases"))
    model = ModelConfig(name=name, num_experts=num_experts, aliases=tuple(aliases), **values)
    _check_divisibility(model, path)
    return model


def _check_divisibility(model: ModelConfig, path: Path) -> None:
    """Each TP/EP size must split the model evenly, as the serving engine requires."""
    def fail(field: str, message: str):
        raise field_error(f"model {model.name!r}: {message}", path, f"{model.name}.{field}")

    if model.is_moe and not model.num_experts_per_tok:
        fail("num_experts_per_tok", "a MoE model (n_routed_experts/num_experts) needs num_experts_per_tok")
    if model.is_moe and not model.moe_intermediate_size:
        fail("moe_intermediate_size", "a MoE model needs moe_intermediate_size")
    if model.is_mla and not (model.qk_nope_head_dim and model.qk_rope_head_dim and model.v_head_dim):
        fail("kv_lora_rank", "an MLA model (kv_lora_rank) needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    if model.intermediate_size == 0 and not model.is_moe:
        fail("intermediate_size", "a dense model needs intermediate_size")
    for tp in model.tp_sizes:
        problem = model.tp_size_problem(tp)
        if problem:
            fail("tp_sizes", problem)
    for ep in model.ep_sizes:
        if model.is_moe and model.num_experts % ep:
            fail("ep_sizes", f"EP size {ep} does not divide the {model.num_experts} routed experts")


def load_models(path: str | Path) -> dict[str, ModelConfig]:
    """Every model of a models.yaml, validated (bad fields are errors naming the model and field)."""
    return {str(name): _model_from_entry(str(name), entry, Path(path)) for name, entry in read_models(path).items()}


def model_from_config_json(config: str | Path | ModelReference) -> ModelConfig:
    """A transformers config.json (a path or a ModelReference) as a models.yaml entry, so that the grid's patterns
    serve a model nobody listed: its text config's attention and vocabulary dims (the same Hugging Face fields), TP 1
    and EP 1. Its experts are those of the model transformers builds from it on meta (expert_layout: the expert
    weights' shapes and the router's top-k), whatever the config calls them: Mixtral's `num_local_experts` x
    `intermediate_size`, OLMoE's `num_experts` x `intermediate_size`, Qwen2-MoE's shared expert (whole experts of
    the routed ones' width). Its `intermediate_size` is a dense MLP's only where some layers hold no experts."""
    from opperf.workload.transformers_model import expert_layout, read_config

    reference = config if isinstance(config, ModelReference) else model_reference(str(config), {})
    path = reference.config_path
    document = read_config(path)
    text = document.get("text_config") if isinstance(document.get("text_config"), dict) else document
    fields = _POSITIVE_INTEGER_FIELDS + _NON_NEGATIVE_INTEGER_FIELDS
    entry: dict[str, object] = {k: v for k, v in text.items()
                                if k in fields and k not in _EXPERT_FIELDS and v is not None}
    experts = expert_layout(document, path)
    if experts is not None:
        entry.update(num_experts=experts.num_experts, num_experts_per_tok=experts.experts_per_token,
                     moe_intermediate_size=experts.intermediate_size)
        if experts.shared_intermediate_size % experts.intermediate_size:
            raise field_error(f"shared_expert_intermediate_size {experts.shared_intermediate_size} is not a whole "
                              f"number of experts of moe_intermediate_size {experts.intermediate_size} (the widths "
                              "of the built model's shared and routed experts)", path,
                              "shared_expert_intermediate_size")
        entry["n_shared_experts"] = experts.shared_intermediate_size // experts.intermediate_size
        if experts.dense_layers:
            entry["first_k_dense_replace"] = experts.dense_layers
        else:
            entry.pop("intermediate_size", None)       # Mixtral's and OLMoE's: each expert's, no dense MLP's
    entry["tp_sizes"] = [1]
    return _model_from_entry(reference.name, entry, path)


def select_models(models: dict[str, ModelConfig], names: list[str], *, path: str | Path | None = None
                  ) -> list[ModelConfig]:
    """The models named by --target-models (name or alias, case/punctuation-insensitive, or a transformers
    config.json; model_reference), in the given order."""
    references = [model_reference(name, models, path=path, field="--target-models", what="target model")
                  for name in names]
    check_distinct_names(references, field="--target-models")
    chosen: list[ModelConfig] = []
    for reference in references:
        model = model_from_config_json(reference) if reference.is_config else models[reference.name]
        if model not in chosen:
            chosen.append(model)
    return chosen
