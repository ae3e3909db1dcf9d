"""A candidate: one row a pattern proposes, before templates, de-duplication, the memory budget and the row cap.

Besides its tensor slots, a candidate says where it sits for the density standard: the density axes it
sweeps with their values (`M_GRID` m=40), and its bucket group, the values it shares with every other
candidate of its bucket (a GEMM's (N, K); an attention layout). The row cap keeps or drops buckets whole,
and `users` (the model configurations the group's values come from) decides which go first.
"""

from __future__ import annotations

from dataclasses import dataclass

Shape = tuple[int, ...]
SWEEP = "sweep"          # the group entry naming the sweep a candidate comes from (values no model runs)
Group = tuple[tuple[str, object], ...]
AxisValues = tuple[tuple[str, str, int], ...]


@dataclass(frozen=True)
class Candidate:
    """One proposed row: tensor slots (None = empty slot), extra column values (EP Size, Runtime …), and its
    place on the density axes: `group` ((name, value) pairs shared by its bucket), `axes` ((name, density
    axis, value) of each axis it sweeps), `users` (model configurations like `Qwen3-32B@tp8` the group comes
    from; None: not tied to a model, so every one)."""

    inputs: tuple[Shape | None, ...]
    outputs: tuple[Shape | None, ...]
    columns: tuple[tuple[str, str], ...] = ()
    group: Group = ()
    axes: AxisValues = ()
    users: frozenset[str] | None = None


def common_users(found: list[frozenset[str] | None]) -> frozenset[str] | None:
    """The configurations behind every model-derived value of a combination (None if it has none): the
    labels all share, else the models all share (a TP-sized and an EP-sized value of one model)."""
    sets = [users for users in found if users is not None]
    if not sets:
        return None
    shared = frozenset.intersection(*sets)
    if shared:
        return shared
    models = frozenset.intersection(*(frozenset(label.split("@")[0] for label in users) for users in sets))
    return frozenset(label for users in sets for label in users if label.split("@")[0] in models)


@dataclass(frozen=True)
class Outside:
    """A combination a generator skips because the kernel cannot take it (KV heads that do not divide the
    query heads): its axis values are not counted missing by the density check."""

    group: Group
    axes: AxisValues
