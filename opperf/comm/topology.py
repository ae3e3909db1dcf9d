"""Where ranks sit in the machine: row-major coordinates over a grid shape, the tier of a group, and
groups built for a requested tier and device count.

A grid shape lists the machine from outermost to innermost level, e.g. `48 8 2` for an Atlas 800 A3
super-pod (48 pods x 8 nodes x 2 dies). Tier t of a group is the first grid dimension in which its
ranks' coordinates differ: on `48 8 2`, 0 = inter-pod, 1 = intra-pod (across nodes), 2 = die level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from opperf.errors import OpperfError

def check_grid_shape(grid_shape: Sequence[int]) -> tuple[int, ...]:
    """A grid shape as a tuple of positive ints, or an error naming the bad dimension."""
    shape = tuple(int(d) for d in grid_shape)
    if not shape:
        raise OpperfError("grid shape is empty (give e.g. --grid-shape 48 8 2)", field="--grid-shape")
    bad = [d for d in shape if d < 1]
    if bad:
        raise OpperfError(f"grid shape {list(shape)} has a dimension < 1", field="--grid-shape")
    return shape


def rank_coordinates(rank: int, grid_shape: Sequence[int]) -> list[int]:
    """Row-major coordinates of `rank`: on `48 8 2`, rank 16 is [1, 0, 0] and 767 is [47, 7, 1]."""
    shape = check_grid_shape(grid_shape)
    if not 0 <= rank < math.prod(shape):
        raise OpperfError(f"rank {rank} is outside grid {list(shape)} "
                          f"(which holds ranks 0..{math.prod(shape) - 1})", field="--grid-shape")
    coordinates = []
    for size in reversed(shape):
        coordinates.append(rank % size)
        rank //= size
    return coordinates[::-1]


def group_tier(ranks: Sequence[int], grid_shape: Sequence[int]) -> int:
    """The tier of a group: the first dimension in which its ranks' coordinates differ."""
    ranks = list(ranks)
    if len(set(ranks)) != len(ranks) or len(ranks) < 2:
        raise OpperfError(f"a group needs at least 2 distinct ranks, got {ranks}")
    coordinates = [rank_coordinates(r, grid_shape) for r in ranks]
    for dim in range(len(coordinates[0])):
        if len({c[dim] for c in coordinates}) > 1:
            return dim
    raise AssertionError("distinct ranks always differ in some dimension")


def _stride(grid_shape: tuple[int, ...], dim: int) -> int:
    return math.prod(grid_shape[dim + 1:])


def build_group(num_devices: int, tier: int, grid_shape: Sequence[int]) -> list[int]:
    """The ranks of a group of `num_devices` whose tier is `tier`, anchored at rank 0.

    Preference, most realistic first: contiguous ranks 0..n-1 (how TP groups are laid out) when they
    have that tier; else one rank per coordinate along the tier's dimension (e.g. tier 0, 2 devices on
    `48 8 2` → [0, 16]); else equal contiguous blocks on as many coordinates along it as divide n.
    """
    shape = check_grid_shape(grid_shape)
    if not 0 <= tier < len(shape):
        raise OpperfError(f"topology tier {tier} does not exist in grid {list(shape)} "
                          f"(tiers 0..{len(shape) - 1})", field="--topology-tier")
    if num_devices < 2:
        raise OpperfError(f"a collective group needs at least 2 devices, got {num_devices}", field="--num-devices")
    inner = _stride(shape, tier)               # ranks below one coordinate of the tier's dimension
    along = shape[tier]                        # coordinates along the tier's dimension
    if inner < num_devices <= inner * along:
        return list(range(num_devices))
    if num_devices <= along:
        return [k * inner for k in range(num_devices)]
    for blocks in range(along, 1, -1):        # as many coordinates as divide the group evenly
        if num_devices % blocks == 0 and num_devices // blocks <= inner:
            return [k * inner + j for k in range(blocks) for j in range(num_devices // blocks)]
    raise OpperfError(f"grid {list(shape)} cannot hold a tier-{tier} group of {num_devices} devices: its "
                      f"ranks must first differ in dimension {tier} ({along} coordinates, {inner} ranks each), "
                      f"so it can have 2..{inner * along} devices"
                      + (f", and from {along + 1} to {inner} only a multiple of one of 2..{along}"
                         if 2 <= along < inner else ""),
                      field="--num-devices")


def default_tier(num_devices: int, grid_shape: Sequence[int]) -> int:
    """The tier of contiguous ranks 0..n-1, used when no tier is asked for."""
    shape = check_grid_shape(grid_shape)
    if num_devices > math.prod(shape):
        raise OpperfError(f"{num_devices} devices do not fit grid {list(shape)} "
                          f"({math.prod(shape)} ranks)", field="--num-devices")
    return group_tier(range(num_devices), shape)


def format_grid_shape(grid_shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in grid_shape)
