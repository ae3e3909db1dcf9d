"""The value grids patterns iterate over: token counts, named grids, and grids derived from target models.

An iterator's source is one of
- `tokens`: token counts on both sides of tile boundaries (1..16, 31/32/33, 63/64/65, ... up to max_tokens);
- a key of `grids:` in grid.yaml (a plain list);
- `model.<name>`: derived from the target models over their TP/EP sizes (see MODEL_GRIDS), or, when no
  model is named, the `generic.<name>` list of grid.yaml.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opperf.errors import OpperfError
from opperf.grid.models import ModelConfig

Value = int | tuple[int, ...]
MODEL_PREFIX = "model."
TOKENS = "tokens"


def token_counts(max_tokens: int, dense_up_to: int = 16) -> list[int]:
    """Every count up to `dense_up_to`, then p-1, p, p+1 for each power of two p (tile boundaries), capped."""
    counts = set(range(1, min(dense_up_to, max_tokens) + 1))
    power = 32
    while power - 1 <= max_tokens:
        counts.update(v for v in (power - 1, power, power + 1) if dense_up_to < v <= max_tokens)
        power *= 2
    return sorted(counts)


def _unique(values) -> list:
    return list(dict.fromkeys(values))


def _per_tp(models: Sequence[ModelConfig], function: Callable[[ModelConfig, int], object]) -> list:
    found = []
    for model in models:
        for tp in model.tp_sizes:
            result = function(model, tp)
            if result is None:
                continue
            found += result if isinstance(result, list) else [result]
    return _unique(found)


def _rope_heads(model: ModelConfig, tp: int) -> list[tuple[int, int]]:
    """(heads, rope dim) of the tensors RoPE rotates on one rank: queries and keys (MLA: the shared k_pe)."""
    heads = model.num_attention_heads // tp
    key_heads = 1 if model.is_mla else model.kv_heads_per_rank(tp)
    return [(heads, model.rope_dim), (key_heads, model.rope_dim)]


# model.<name> → how to derive it from the target models (first-seen order, duplicates dropped).
MODEL_GRIDS: dict[str, Callable[[Sequence[ModelConfig]], list[Value]]] = {
    "gemm_nk": lambda models: _per_tp(models, lambda m, tp: [(n, k) for _, n, k in m.gemm_projections(tp)]),
    "hidden": lambda models: _unique(m.hidden_size for m in models),
    "mlp_width": lambda models: _per_tp(models, lambda m, tp: m.mlp_widths(tp)),
    "widths": lambda models: _unique([m.hidden_size for m in models]
                                     + _per_tp(models, lambda m, tp: m.mlp_widths(tp))),
    "attention": lambda models: _per_tp(models, lambda m, tp: m.attention_layout(tp)),
    "mla": lambda models: _per_tp(models, lambda m, tp: m.mla_layout(tp)),
    "heads": lambda models: _per_tp(models, lambda m, tp: m.num_attention_heads // tp),
    "rope": lambda models: _per_tp(models, _rope_heads),
    "vocab": lambda models: _per_tp(models, lambda m, tp: -(-m.vocab_size // tp)),
    "embedding": lambda models: _per_tp(models, lambda m, tp: (-(-m.vocab_size // tp), m.hidden_size)),
    "experts": lambda models: _unique(layout for m in models for layout in m.expert_layouts()),
    "gating": lambda models: _unique((m.num_experts, m.num_experts_per_tok) for m in models if m.is_moe),
}


class ValueGrids:
    """Resolves iterator sources to lists of values for one run (fixed models, token cap and config)."""

    def __init__(self, *, grids: dict[str, list[Value]], generic: dict[str, list[Value]],
                 models: Sequence[ModelConfig], max_tokens: int, dense_tokens_up_to: int = 16,
                 config_path: str | None = None):
        self.grids = grids
        self.generic = generic
        self.models = list(models)
        self.max_tokens = max_tokens
        self.dense_tokens_up_to = dense_tokens_up_to
        self.config_path = config_path
        self._cache: dict[str, list[Value]] = {}

    @property
    def tokens(self) -> list[int]:
        return self.values(TOKENS, field="tokens")

    def values(self, source: str, *, field: str) -> list[Value]:
        """The values of one source; an unknown source is an error naming the pattern field."""
        if source not in self._cache:
            self._cache[source] = self._resolve(source, field)
        return self._cache[source]

    def _resolve(self, source: str, field: str) -> list[Value]:
        if source == TOKENS:
            return token_counts(self.max_tokens, self.dense_tokens_up_to)
        if source.startswith(MODEL_PREFIX):
            name = source[len(MODEL_PREFIX):]
            if name not in MODEL_GRIDS:
                raise OpperfError(f"unknown model grid {source!r} (known: "
                                  f"{', '.join(MODEL_PREFIX + n for n in MODEL_GRIDS)})",
                                  path=self.config_path, field=field)
            if self.models:
                return MODEL_GRIDS[name](self.models)
            if name not in self.generic:
                raise OpperfError(f"{source!r} needs a target model or a generic.{name} list in the grid config",
                                  path=self.config_path, field=field)
            return list(self.generic[name])
        if source in self.grids:
            return list(self.grids[source])
        raise OpperfError(f"unknown value grid {source!r} (known: {TOKENS}, "
                          f"{', '.join(sorted(self.grids))}, model.<{'|'.join(MODEL_GRIDS)}>)",
                          path=self.config_path, field=field)
