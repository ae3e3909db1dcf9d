"""Candidate rows: the shapes a pattern proposes, before templates, de-duplication and the HBM budget."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from opperf.errors import OpperfError
from opperf.grid.config import MAX_COMBINATIONS, Pattern
from opperf.grid.evaluator import ExpressionError
from opperf.grid.values import ValueGrids

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Candidate:
    """One proposed row: tensor slots (None = empty slot) and any extra column values (EP Size, Runtime …)."""

    inputs: tuple[Shape | None, ...]
    outputs: tuple[Shape | None, ...]
    columns: tuple[tuple[str, str], ...] = ()


@dataclass
class CandidateStats:
    """What happened to a pattern's combinations before they became candidates."""

    combinations: int = 0
    rejected_by_constraints: int = 0
    invalid_dimensions: int = 0
    notes: list[str] = field(default_factory=list)


def pattern_candidates(pattern: Pattern, grids: ValueGrids, stats: CandidateStats,
                       config_path: str | None = None) -> Iterator[Candidate]:
    """Every candidate of one pattern, in a fixed order (iterators in declared order, last varying fastest)."""
    if pattern.generator:
        from opperf.grid.generators import GENERATORS

        for candidate in GENERATORS[pattern.generator].generate(pattern.params, grids):
            stats.combinations += 1
            if _has_invalid_dimension(candidate):
                stats.invalid_dimensions += 1
                continue
            yield candidate
        return
    yield from _declarative_candidates(pattern, grids, stats, config_path)


def _has_invalid_dimension(candidate: Candidate) -> bool:
    return any(d < 1 for shape in candidate.inputs + candidate.outputs if shape for d in shape)


def _iterator_values(pattern: Pattern, grids: ValueGrids, config_path) -> list[list[tuple[int, ...]]]:
    """Per iterator, its values as tuples aligned with the names it binds."""
    columns = []
    for spec in pattern.iterators:
        where = f"patterns.{pattern.name}.iterators.{', '.join(spec.names)}"
        values = list(spec.inline) if spec.inline is not None else grids.values(spec.source, field=where)
        aligned = []
        for value in values:
            value_tuple = value if isinstance(value, tuple) else (value,)
            if len(value_tuple) != len(spec.names):
                raise OpperfError(f"pattern {pattern.name!r}: iterator {', '.join(spec.names)!r} binds "
                                  f"{len(spec.names)} name(s) but {spec.source or 'its list'} gives {value!r}",
                                  path=config_path, field=where)
            aligned.append(value_tuple)
        columns.append(aligned)
    return columns


def _declarative_candidates(pattern: Pattern, grids: ValueGrids, stats: CandidateStats,
                            config_path) -> Iterator[Candidate]:
    columns = _iterator_values(pattern, grids, config_path)
    total = 1
    for values in columns:
        total *= len(values)
    if total > MAX_COMBINATIONS:
        raise OpperfError(f"pattern {pattern.name!r} enumerates {total} combinations (limit {MAX_COMBINATIONS}); "
                          "narrow its iterators or add constraints on smaller grids",
                          path=config_path, field=f"patterns.{pattern.name}.iterators")
    names = [n for spec in pattern.iterators for n in spec.names]
    base_env = {"max_tokens": grids.max_tokens, **pattern.constants}
    for combination in itertools.product(*columns):
        stats.combinations += 1
        env = dict(base_env)
        env.update(zip(names, (v for value in combination for v in value)))
        try:
            if not all(c.evaluate(env) for c in pattern.constraints):
                stats.rejected_by_constraints += 1
                continue
            inputs = tuple(s.evaluate(env) for s in pattern.inputs)
            outputs = tuple(s.evaluate(env) for s in pattern.outputs)
            extra = tuple((column, str(expression.evaluate(env))) for column, expression in pattern.columns)
        except ExpressionError as exc:
            raise OpperfError(f"pattern {pattern.name!r}: {exc}", path=config_path,
                              field=f"patterns.{pattern.name}") from None
        candidate = Candidate(inputs, outputs, extra)
        if _has_invalid_dimension(candidate):
            stats.invalid_dimensions += 1
            continue
        yield candidate
