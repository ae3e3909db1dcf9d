"""Rank coordinates, group tiers and group building over grid shapes (issue 5 acceptance)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opperf.comm.bench import plan_groups, world_size_needed
from opperf.comm.topology import build_group, default_tier, group_tier, rank_coordinates
from opperf.errors import OpperfError

A3 = (48, 8, 2)


def test_rank_coordinates_are_row_major():
    assert rank_coordinates(16, A3) == [1, 0, 0]
    assert rank_coordinates(767, A3) == [47, 7, 1]
    assert rank_coordinates(0, A3) == [0, 0, 0]
    assert rank_coordinates(3, A3) == [0, 1, 1]
    assert rank_coordinates(9, (128, 8)) == [1, 1]


def test_rank_outside_the_grid_is_an_error():
    with pytest.raises(OpperfError, match="rank 768 is outside grid"):
        rank_coordinates(768, A3)


@pytest.mark.parametrize("ranks, tier", [([0, 1], 2), ([0, 2], 1), (list(range(16)), 1), ([0, 16], 0),
                                         (list(range(32)), 0), ([2, 3], 2), ([1, 3], 1)])
def test_group_tier_is_the_first_differing_dimension(ranks, tier):
    assert group_tier(ranks, A3) == tier


def test_group_tier_needs_two_distinct_ranks():
    with pytest.raises(OpperfError, match="at least 2 distinct"):
        group_tier([5, 5], A3)


@pytest.mark.parametrize("count, tier, expected", [
    (2, 2, [0, 1]),                       # the two dies of one node
    (2, 1, [0, 2]),                       # one die of two nodes
    (2, 0, [0, 16]),                      # two pods
    (16, 1, list(range(16))),             # TP=16: a whole pod, contiguous
    (4, 1, [0, 1, 2, 3]),                 # contiguous ranks already span nodes
    (16, 0, [16 * k for k in range(16)]),
    (32, 0, list(range(32))),
])
def test_build_group_for_a_tier(count, tier, expected):
    assert build_group(count, tier, A3) == expected
    assert group_tier(expected, A3) == tier


def test_build_group_in_blocks_when_the_tier_dimension_is_short():
    group = build_group(4, 0, (2, 8, 2))
    assert group == [0, 1, 16, 17]
    assert group_tier(group, (2, 8, 2)) == 0


@pytest.mark.parametrize("count, tier, grid, message", [
    (16, 2, A3, "cannot hold a tier-2 group of 16 devices"),
    (3, 0, (2, 8, 2), "cannot hold a tier-0 group of 3 devices"),
    (2, 3, A3, "topology tier 3 does not exist"),
    (1, 1, A3, "at least 2 devices"),
])
def test_impossible_groups_are_clear_errors(count, tier, grid, message):
    with pytest.raises(OpperfError, match=message):
        build_group(count, tier, grid)


@settings(max_examples=200, deadline=None)
@given(grid=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data())
def test_every_built_group_has_the_asked_size_and_tier(grid, data):
    tier = data.draw(st.integers(0, len(grid) - 1))
    count = data.draw(st.integers(2, max(2, math.prod(grid))))
    try:
        group = build_group(count, tier, grid)
    except OpperfError:
        return
    assert len(group) == count == len(set(group))
    assert all(0 <= rank < math.prod(grid) for rank in group)
    assert group_tier(group, grid) == tier


def test_plan_defaults_to_the_tier_of_contiguous_ranks():
    plans = plan_groups([16, 2], None, A3)
    assert [(p.num_devices, p.tier, p.ranks[:3]) for p in plans] == [(16, 1, (0, 1, 2)), (2, 2, (0, 1))]
    assert world_size_needed(plans) == 16
    assert default_tier(2, (1, 8)) == 1
    with pytest.raises(OpperfError, match="do not fit grid"):
        default_tier(9, (1, 8))


def test_plan_with_tiers_builds_each_pair_and_counts_the_processes():
    plans = plan_groups([2], [0, 1, 2], A3)
    assert [p.ranks for p in plans] == [(0, 16), (0, 2), (0, 1)]
    assert world_size_needed(plans) == 17

