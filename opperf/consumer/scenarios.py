"""Scenarios: one step of a model (`Scenario`), as a user writes it (`ScenarioText`), and the scenario spaces of
config/scenarios.yaml (`ScenarioSpace`: the prefill token counts, decode batches x contexts and TP sizes a database
must answer a model's steps at). Read without torch, so that the workflow's config check (grid.scenario_space)
costs nothing at start-up; the steps themselves are recorded in opperf.consumer.model_queries."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from opperf.errors import OpperfError

DEFAULT_SCENARIO_SPACE = Path(__file__).resolve().parents[2] / "config" / "scenarios.yaml"
SCENARIO_FORMS = "prefill:TOKENS or decode:BATCHxCONTEXT, e.g. prefill:1536, decode:16x1024"
_SCENARIO_TEXT = re.compile(r"^(prefill):(\d+)$|^(decode):(\d+)x(\d+)$")


@dataclass(frozen=True)
class Scenario:
    """One forward step of one rank: prefill of `tokens` (batch 1), or decode of `batch` sequences that each
    hold `context` tokens in the KV cache."""

    model: str
    tp: int
    phase: str            # prefill | decode
    batch: int
    tokens: int
    context: int = 0

    @property
    def label(self) -> str:
        shape = f"{self.tokens} tokens" if self.phase == "prefill" else f"batch {self.batch}, context {self.context}"
        return f"{self.model} TP{self.tp} {self.phase} {shape}"


@dataclass(frozen=True)
class ScenarioText:
    """A scenario as a user writes it (`prefill:TOKENS`, `decode:BATCHxCONTEXT`), before it names a model."""

    phase: str            # prefill | decode
    batch: int
    tokens: int
    context: int = 0

    @property
    def positions(self) -> int:
        """The positions the step reaches: its tokens after the context in the KV cache."""
        return self.context + self.tokens


def parse_scenario_text(text: str) -> ScenarioText:
    """`prefill:TOKENS` (batch 1) or `decode:BATCHxCONTEXT` (one token per sequence over CONTEXT cached tokens),
    every count >= 1: the one reading of a scenario, for scripts/predict.py and the workflow's config check
    (predict.scenarios) alike. Errors are one line quoting the text."""
    match = _SCENARIO_TEXT.match(str(text).strip())
    if match is None:
        raise OpperfError(f"not a scenario: {text!r} ({SCENARIO_FORMS})")
    if match.group(1):
        scenario = ScenarioText("prefill", 1, int(match.group(2)))
        counts = {"TOKENS": scenario.tokens}
    else:
        scenario = ScenarioText("decode", int(match.group(4)), 1, int(match.group(5)))
        counts = {"BATCH": scenario.batch, "CONTEXT": scenario.context}
    empty = [name for name, value in counts.items() if value < 1]
    if empty:
        raise OpperfError(f"{text!r}: {empty[0]} must be >= 1, got 0 ({SCENARIO_FORMS})")
    return scenario


def parse_scenario_option(text: str, option: str = "--scenario") -> ScenarioText:
    """parse_scenario_text of a command-line option's value: its error names the option."""
    try:
        return parse_scenario_text(text)
    except OpperfError as exc:
        raise OpperfError(exc.reason, field=option) from None


@dataclass(frozen=True)
class ScenarioSpace:
    """The scenarios a database must answer for a model: prefill at each token count (batch 1), decode at each
    batch x context, each at every TP size."""

    prefill_tokens: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    tp_sizes: tuple[int, ...] = (1,)

    def scenarios(self, model: str, tp_sizes: Sequence[int] | None = None) -> list[Scenario]:
        sizes = tuple(tp_sizes) if tp_sizes else self.tp_sizes
        return ([Scenario(model, tp, "prefill", 1, t) for tp in sizes for t in self.prefill_tokens]
                + [Scenario(model, tp, "decode", b, 1, c) for tp in sizes for c in self.decode_contexts
                   for b in self.decode_batches])

    def between_points(self) -> list[str]:
        """Scenarios between the space's points, as scenario texts: the prefill between each two neighbouring token
        counts, and decode between neighbouring batches, between neighbouring contexts and between both (the
        midpoints, where two points leave room for one). msmodeling must answer them from rows laid at the points
        (docs/msmodeling.md, "Rows where its runtime looks")."""
        def middles(points: Sequence[int]) -> list[int]:
            return [(a + b) // 2 for a, b in zip(points, points[1:]) if b - a >= 2]

        batches, contexts = middles(self.decode_batches), middles(self.decode_contexts)
        decode = ([(b, c) for c in self.decode_contexts for b in batches]
                  + [(b, c) for c in contexts for b in self.decode_batches]
                  + [(b, c) for c in contexts for b in batches])
        return ([f"prefill:{tokens}" for tokens in middles(self.prefill_tokens)]
                + [f"decode:{b}x{c}" for b, c in decode])


def _positive_ints(value, path: Path, key: str) -> tuple[int, ...]:
    if (not isinstance(value, list) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        raise OpperfError(f"must be a non-empty list of integers >= 1, got {value!r}", path=path, field=key)
    return tuple(sorted(set(value)))


def load_scenario_space(path: str | Path = DEFAULT_SCENARIO_SPACE, name: str = "default") -> ScenarioSpace:
    """The scenario space `name` of a scenarios YAML (config/scenarios.yaml: `spaces: {name: {prefill_tokens,
    decode_batches, decode_contexts, tp_sizes}}`)."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise OpperfError(f"cannot read the scenario space: {exc.strerror}", path=path) from exc
    except yaml.YAMLError as exc:
        raise OpperfError(f"not valid YAML: {exc}", path=path) from exc
    spaces = (document or {}).get("spaces") if isinstance(document, dict) else None
    if not isinstance(spaces, dict) or name not in spaces:
        known = ", ".join(sorted(spaces)) if isinstance(spaces, dict) else "none"
        raise OpperfError(f"no scenario space {name!r} (spaces: {known})", path=path, field=f"spaces.{name}")
    space = spaces[name]
    if not isinstance(space, dict):
        raise OpperfError("must be a mapping", path=path, field=f"spaces.{name}")
    unknown = set(space) - {"prefill_tokens", "decode_batches", "decode_contexts", "tp_sizes", "description"}
    if unknown:
        raise OpperfError(f"unknown keys {sorted(unknown)}", path=path, field=f"spaces.{name}")
    return ScenarioSpace(*(_positive_ints(space.get(key), path, f"spaces.{name}.{key}")
                           for key in ("prefill_tokens", "decode_batches", "decode_contexts")),
                         tp_sizes=_positive_ints(space.get("tp_sizes", [1]), path, f"spaces.{name}.tp_sizes"))
