"""A pattern's candidates: the cartesian product of a declarative pattern's iterators, or a generator's rows.

A declarative pattern enumerates its main iterators and then each of its sweeps (further iterator sets
over the same shapes, each varying one density axis around a model's values). An iterator whose source is
a density axis sweeps it; every other iterator's value belongs to the candidate's bucket group.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from opperf.errors import OpperfError
from opperf.grid.candidate import SWEEP, AxisValues, Candidate, Group, Outside, common_users
from opperf.grid.config import IGNORED, MAX_COMBINATIONS, IteratorSpec, Pattern
from opperf.grid.evaluator import ExpressionError
from opperf.grid.generators import GENERATORS
from opperf.grid.values import ValueGrids



@dataclass
class CandidateStats:
    """What happened to a pattern's combinations before they became candidates."""

    combinations: int = 0
    rejected_by_constraints: int = 0
    invalid_dimensions: int = 0
    # (group, axes) of combinations outside the kernel's domain (a constraint, a dimension < 1): the density
    # check does not count their axis values as missing.
    excluded: list[tuple[Group, AxisValues]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pattern_candidates(pattern: Pattern, grids: ValueGrids, stats: CandidateStats,
                       config_path: str | None = None) -> Iterator[Candidate]:
    """Every candidate of one pattern, in a fixed order (iterators in declared order, last varying fastest)."""
    if pattern.generator:
        for candidate in GENERATORS[pattern.generator].generate(pattern.params, grids):
            stats.combinations += 1
            if isinstance(candidate, Outside):
                stats.rejected_by_constraints += 1
                stats.excluded.append((candidate.group, candidate.axes))
                continue
            if _has_invalid_dimension(candidate):
                stats.invalid_dimensions += 1
                stats.excluded.append((candidate.group, candidate.axes))
                continue
            yield candidate
        return
    for sweep, iterators in pattern.iterator_sets:
        yield from _declarative_candidates(pattern, sweep, iterators, grids, stats, config_path)


def _has_invalid_dimension(candidate: Candidate) -> bool:
    return any(d < 1 for shape in candidate.inputs + candidate.outputs if shape for d in shape)


def _iterator_values(pattern: Pattern, iterators: tuple[IteratorSpec, ...], grids: ValueGrids,
                     config_path) -> list[list[tuple[int, ...]]]:
    """Per iterator, its values as tuples aligned with the names it binds."""
    columns = []
    for spec in iterators:
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


def _declarative_candidates(pattern: Pattern, sweep: str, iterators: tuple[IteratorSpec, ...], grids: ValueGrids,
                            stats: CandidateStats, config_path) -> Iterator[Candidate]:
    columns = _iterator_values(pattern, iterators, grids, config_path)
    total = 1
    for values in columns:
        total *= len(values)
    if total > MAX_COMBINATIONS:
        raise OpperfError(f"pattern {pattern.name!r} enumerates {total} combinations (limit {MAX_COMBINATIONS}); "
                          "narrow its iterators or add constraints on smaller grids",
                          path=config_path, field=f"patterns.{pattern.name}.iterators")
    names = [n for spec in iterators for n in spec.names]
    is_axis = [grids.is_axis(spec.source) for spec in iterators]
    base_env = {"max_tokens": grids.max_tokens, **pattern.constants}
    for combination in itertools.product(*columns):
        stats.combinations += 1
        group: list[tuple[str, object]] = [(SWEEP, sweep)] if sweep else []
        axes, users = [], []
        for spec, axis, value in zip(iterators, is_axis, combination):
            if axis:
                axes.append((spec.names[0], spec.source, value[0]))
                continue
            group.extend((name, v) for name, v in zip(spec.names, value) if name != IGNORED)
            users.append(grids.users(spec.source, value if len(value) > 1 else value[0]))
        model_users = common_users(users)
        if model_users is None and sweep:
            model_users = frozenset()        # a sweep anchored on no model value serves the standard, not a model
        position = (tuple(group), tuple(axes))
        env = dict(base_env)
        env.update((name, v) for name, v in zip(names, (v for value in combination for v in value))
                   if name != IGNORED)
        try:
            if not all(c.evaluate(env) for c in pattern.constraints):
                stats.rejected_by_constraints += 1
                stats.excluded.append(position)
                continue
            inputs = tuple(s.evaluate(env) for s in pattern.inputs)
            outputs = tuple(s.evaluate(env) for s in pattern.outputs)
            extra = tuple((column, str(expression.evaluate(env))) for column, expression in pattern.columns)
        except ExpressionError as exc:
            raise OpperfError(f"pattern {pattern.name!r}: {exc}", path=config_path,
                              field=f"patterns.{pattern.name}") from None
        candidate = Candidate(inputs, outputs, extra, *position, model_users)
        if _has_invalid_dimension(candidate):
            stats.invalid_dimensions += 1
            stats.excluded.append(position)
            continue
        yield candidate
