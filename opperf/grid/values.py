"""The value grids patterns iterate over: density axes, named grids, and grids derived from target models.

An iterator's source is one of
- a density axis of the standard (`M_GRID`, `ELEM_TOKENS_GRID`, `HEADS_GRID`, ..., a template axis such as
  `transpose_batch_matmul.K`): the smallest point set meeting the standard over the axis' range, stopped
  at the back end's cap for the axis if grid.yaml `axis_caps` sets one; a token axis (`token_counts.axes`)
  also stops at the run's token cap and, unless the back end turns them off, gets the tile boundaries
  (every count up to `dense_up_to`, then p-1, p, p+1 for each power of two p);
- `tokens`: the tile boundaries alone; `sweep_tokens`: the one token count sweeps hold (grid.yaml
  `token_counts.sweep_at`, at most the token cap);
- a key of `grids:` in grid.yaml (a plain list);
- `model.<name>`: derived from the target models over their TP/EP sizes (see MODEL_GRIDS), or, when no
  model is named, the `generic.<name>` list of grid.yaml.

For the row cap, a model-derived value remembers which model configurations (`Qwen3-32B@tp8`) gave it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opperf.density import DensityStandard
from opperf.errors import OpperfError
from opperf.grid.models import ModelConfig

Value = int | tuple[int, ...]
MODEL_PREFIX = "model."
TOKENS = "tokens"
SWEEP_TOKENS = "sweep_tokens"
PER_TP, PER_EP, PER_MODEL = "tp", "ep", ""


def token_counts(max_tokens: int, dense_up_to: int = 16) -> list[int]:
    """Every count up to `dense_up_to`, then p-1, p, p+1 for each power of two p (tile boundaries), capped."""
    counts = set(range(1, min(dense_up_to, max_tokens) + 1))
    power = 32
    while power - 1 <= max_tokens:
        counts.update(v for v in (power - 1, power, power + 1) if dense_up_to < v <= max_tokens)
        power *= 2
    return sorted(counts)


def _rope_heads(model: ModelConfig, tp: int) -> list[tuple[int, int]]:
    """(heads, rope dim) of the tensors RoPE rotates on one rank: queries and keys (MLA: the shared k_pe)."""
    heads = model.num_attention_heads // tp
    key_heads = 1 if model.is_mla else model.kv_heads_per_rank(tp)
    return [(heads, model.rope_dim), (key_heads, model.rope_dim)]


def _listed(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


# model.<name> → (the parallel sizes it ranges over, the values of one model at one size).
MODEL_GRIDS: dict[str, tuple[str, Callable[[ModelConfig, int], object]]] = {
    "gemm_nk": (PER_TP, lambda m, tp: [(n, k) for _, n, k in m.gemm_projections(tp)]),
    "hidden": (PER_MODEL, lambda m, _: m.hidden_size),
    "mlp_width": (PER_TP, lambda m, tp: m.mlp_widths(tp)),
    "widths": (PER_TP, lambda m, tp: [m.hidden_size] + m.mlp_widths(tp)),
    "attention": (PER_TP, lambda m, tp: m.attention_layout(tp)),
    "mla": (PER_TP, lambda m, tp: m.mla_layout(tp)),
    "heads": (PER_TP, lambda m, tp: m.num_attention_heads // tp),
    "rope": (PER_TP, _rope_heads),
    "vocab": (PER_TP, lambda m, tp: -(-m.vocab_size // tp)),
    "embedding": (PER_TP, lambda m, tp: (-(-m.vocab_size // tp), m.hidden_size)),
    "experts": (PER_EP, lambda m, ep: m.expert_layout(ep)),
    "gating": (PER_MODEL, lambda m, _: (m.num_experts, m.num_experts_per_tok) if m.is_moe else None),
    # Anchors of the attention sweeps (one axis varied, the others at a model's values; see docs/grid.md):
    "kv_layout": (PER_TP, lambda m, tp: None if m.is_mla else (m.kv_heads_per_rank(tp), m.head_dim)),
    "head_layout": (PER_TP, lambda m, tp: None if m.is_mla else (m.num_attention_heads // tp, m.head_dim)),
    "heads_kv": (PER_TP, lambda m, tp: None if m.is_mla else (m.num_attention_heads // tp, m.kv_heads_per_rank(tp))),
    "head_dim": (PER_MODEL, lambda m, _: None if m.is_mla else m.head_dim),
    "rope_dim": (PER_MODEL, lambda m, _: m.rope_dim),
    "mla_rank": (PER_MODEL, lambda m, _: (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)
                 if m.is_mla else None),
}


def _configurations(model: ModelConfig, per: str) -> list[tuple[int, frozenset[str]]]:
    """(size, configurations using the values at that size): a per-model value serves every TP size."""
    if per == PER_TP:
        return [(tp, frozenset({f"{model.name}@tp{tp}"})) for tp in model.tp_sizes]
    if per == PER_EP:
        return [(ep, frozenset({f"{model.name}@ep{ep}"})) for ep in model.ep_sizes] if model.is_moe else []
    return [(1, frozenset(f"{model.name}@tp{tp}" for tp in model.tp_sizes))]


class ValueGrids:
    """Resolves iterator sources to lists of values for one run (fixed models, token cap, config, standard)."""

    def __init__(self, *, grids: dict[str, list[Value]], generic: dict[str, list[Value]],
                 models: Sequence[ModelConfig], max_tokens: int, standard: DensityStandard,
                 token_axes: Sequence[str] = (), axis_caps: dict[str, int] | None = None,
                 tile_boundaries: bool = True, dense_tokens_up_to: int = 16, sweep_at: int = 256,
                 config_path: str | None = None):
        self.grids = grids
        self.generic = generic
        self.models = list(models)
        self.max_tokens = max_tokens
        self.standard = standard
        self.token_axes = tuple(token_axes)
        self.axis_caps = dict(axis_caps or {})
        self.tile_boundaries = tile_boundaries
        self.dense_tokens_up_to = dense_tokens_up_to
        self.sweep_at = sweep_at
        self.config_path = config_path
        self._cache: dict[str, list[Value]] = {}
        self._users: dict[str, dict[Value, frozenset[str]]] = {}

    @property
    def tokens(self) -> list[int]:
        return self.values(TOKENS, field="tokens")

    def is_axis(self, source: str | None) -> bool:
        """Whether a source is a density axis of the standard (its iterator sweeps that axis)."""
        return source is not None and source in self.standard

    def values(self, source: str, *, field: str) -> list[Value]:
        """The values of one source; an unknown source is an error naming the pattern field."""
        if source not in self._cache:
            self._cache[source] = self._resolve(source, field)
        return self._cache[source]

    def users(self, source: str | None, value: Value) -> frozenset[str] | None:
        """The model configurations that give `value` in a model grid; None for a source that is not one."""
        if source is None or not source.startswith(MODEL_PREFIX) or not self.models:
            return None
        if source not in self._users:
            self._model_values(source[len(MODEL_PREFIX):])
        return self._users[source].get(value, frozenset())

    def axis_high(self, axis: str) -> int | None:
        """The largest value this run gives an axis: its cap on the back end, the token cap (None: the rule's)."""
        rule = self.standard.rule(axis)
        caps = [cap for cap in (self.axis_caps.get(rule.name),
                                self.max_tokens if rule.name in self.token_axes else None) if cap is not None]
        return min(caps) if caps else None

    def axis_values(self, axis: str) -> list[int]:
        """An axis' point set: the standard's over the axis range (capped; a token axis with tile boundaries)."""
        rule = self.standard.rule(axis)
        high = self.axis_high(axis)
        if rule.name not in self.token_axes or not self.tile_boundaries:
            return rule.points(high=high)
        low, high = rule.window(high=high)
        tiles = [v for v in token_counts(high, self.dense_tokens_up_to) if v >= low]
        return sorted(set(rule.points(high=high)) | set(tiles))

    def _model_values(self, name: str) -> list[Value]:
        per, function = MODEL_GRIDS[name]
        found: dict[Value, set[str]] = {}
        for model in self.models:
            for size, labels in _configurations(model, per):
                for value in _listed(function(model, size)):
                    found.setdefault(value, set()).update(labels)
        self._users[MODEL_PREFIX + name] = {value: frozenset(labels) for value, labels in found.items()}
        return list(found)

    def _resolve(self, source: str, field: str) -> list[Value]:
        if source == TOKENS:
            return token_counts(self.max_tokens, self.dense_tokens_up_to)
        if source == SWEEP_TOKENS:
            return [min(self.sweep_at, self.max_tokens)]
        if self.is_axis(source):
            return self.axis_values(source)
        if source.startswith(MODEL_PREFIX):
            name = source[len(MODEL_PREFIX):]
            if name not in MODEL_GRIDS:
                raise OpperfError(f"unknown model grid {source!r} (known: "
                                  f"{', '.join(MODEL_PREFIX + n for n in MODEL_GRIDS)})",
                                  path=self.config_path, field=field)
            if self.models:
                return self._model_values(name)
            if name not in self.generic:
                raise OpperfError(f"{source!r} needs a target model or a generic.{name} list in the grid config",
                                  path=self.config_path, field=field)
            return list(self.generic[name])
        if source in self.grids:
            return list(self.grids[source])
        raise OpperfError(f"unknown value grid {source!r} (known: {TOKENS}, {SWEEP_TOKENS}, density axes "
                          f"{', '.join(sorted(self.standard.rules))}, {', '.join(sorted(self.grids))}, "
                          f"model.<{'|'.join(MODEL_GRIDS)}>)", path=self.config_path, field=field)
