"""Buckets: what the row cap keeps or drops whole, and the per-axis point sets the density check reads.

A bucket is one pattern's generated rows on one template (dtypes, formats) that share every value but
their density axes: a GEMM (N, K) pair with all its M values, an FIA layout with all its batches and
sequence lengths. The row cap never samples inside a bucket, since a thinned bucket interpolates worse
than the standard allows; it keeps the most-used buckets whole and drops the rest: sweeps (values no
model runs, there for the standard's other axes) before the models' own buckets, and among those the
ones fewer target-model configurations (`Qwen3-32B@tp8`) use, then those of later target models. It
stops at the first bucket that does not fit, so no bucket goes while a less-used one stays.

An axis point set is one density axis inside one bucket with the other axes held: the values it
has (new rows or rows the CSV already had) and the values it may lack because the kernel cannot take them
there (a constraint, the memory budget, a template slot that cannot store the shape).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from opperf.grid.candidate import SWEEP, AxisValues, Group

NEW, DUPLICATE, EXCUSED = "new", "duplicate", "excused"


@dataclass(frozen=True)
class BucketKey:
    """A bucket: pattern, template index (first-seen order of the kernel type's profiled rows), group."""

    pattern: str
    template: int
    group: Group

    def describe(self) -> str:
        values = " ".join(f"{name}={value}" for name, value in self.group)
        return f"{self.pattern}[template {self.template}]" + (f" {values}" if values else "")

    @property
    def is_sweep(self) -> bool:
        """A sweep's bucket: values no model runs, there for the standard's coverage."""
        return any(name == SWEEP for name, _ in self.group)


@dataclass
class Bucket:
    key: BucketKey
    users: frozenset[str] | None
    rows: list[int] = field(default_factory=list)      # indices into the kernel type's generated rows


@dataclass
class AxisPointSet:
    """One density axis of one bucket, the bucket's other axes held at `held`."""

    kernel_type: str
    axis: str                      # the standard's axis name (M_GRID, ATTN_SEQ_GRID, a template axis)
    name: str                      # the pattern's name for it (m, seq_len)
    bucket: BucketKey
    held: tuple[tuple[str, int], ...]
    present: set[int] = field(default_factory=set)
    excused: set[int] = field(default_factory=set)
    dropped_by_row_cap: bool = False
    signatures: dict[int, set[tuple]] = field(default_factory=dict)     # value → row signatures (contract)

    def describe(self) -> str:
        held = " ".join(f"{name}={value}" for name, value in self.held)
        return f"{self.kernel_type} {self.bucket.describe()}" + (f" {held}" if held else "") + f" along {self.name}"


class PointSetRecorder:
    """Collects, per axis of each bucket, which values became rows and which the kernel cannot take."""

    def __init__(self, kernel_type: str):
        self.kernel_type = kernel_type
        self._sets: dict[tuple, AxisPointSet] = {}

    def record(self, key: BucketKey, axes: AxisValues, outcome: str, signature: tuple | None = None) -> None:
        for index, (name, axis, value) in enumerate(axes):
            held = tuple((other, other_value) for position, (other, _, other_value) in enumerate(axes)
                         if position != index)
            point_set = self._sets.get((key, name, held))
            if point_set is None:
                point_set = self._sets[(key, name, held)] = AxisPointSet(self.kernel_type, axis, name, key, held)
            (point_set.excused if outcome == EXCUSED else point_set.present).add(value)
            if signature is not None:
                point_set.signatures.setdefault(value, set()).add(signature)

    def point_sets(self, dropped: set[BucketKey] = frozenset()) -> list[AxisPointSet]:
        """The point sets with at least one value present (others never fitted this template)."""
        out = [s for s in self._sets.values() if s.present]
        for point_set in out:
            point_set.dropped_by_row_cap = point_set.bucket in dropped
        return out


def _use(users: frozenset[str] | None, all_configurations: int) -> int:
    return all_configurations if users is None else len(users)


def _first_model(users: frozenset[str] | None, model_order: Sequence[str]) -> int:
    if users is None:
        return -1
    positions = [model_order.index(label.split("@")[0]) for label in users if label.split("@")[0] in model_order]
    return min(positions, default=len(model_order))


def choose_buckets(buckets: Sequence[Bucket], cap: int, *, seed: int, kernel_type: str,
                   model_order: Sequence[str], all_configurations: int) -> tuple[list[Bucket], list[Bucket]]:
    """(kept, dropped) buckets under a cap on their rows; cap 0 keeps all. Dropped comes first-dropped first.

    Buckets are ranked: models' own before sweeps, then by use (target-model configurations), then those
    of the earlier target model, then a seeded order (SHA-256 of seed, kernel type and bucket: independent
    of PYTHONHASHSEED). They are kept in rank order until the next one does not fit; it and every bucket
    after it are dropped, so a bucket is never dropped while a less-used one is kept.
    """
    if cap <= 0 or sum(len(b.rows) for b in buckets) <= cap:
        return list(buckets), []

    def rank(bucket: Bucket):
        digest = hashlib.sha256(f"{seed}:{kernel_type}:{bucket.key!r}".encode()).hexdigest()
        return (bucket.key.is_sweep, -_use(bucket.users, all_configurations), _first_model(bucket.users, model_order),
                digest)

    ranked = sorted(buckets, key=rank)
    total = 0
    for count, bucket in enumerate(ranked):
        if total + len(bucket.rows) > cap:
            return ranked[:count], ranked[count:][::-1]
        total += len(bucket.rows)
    return ranked, []

