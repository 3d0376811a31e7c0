NUM_GPUS = 0

from math import prod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynarl.components.trainer.base import shard_ranges
from dynarl.core.reshard_plan import LayoutError, Shard, Transfer, check_tiling, flat_layout, plan_reshard

STATES = ("master", "exp_avg", "exp_avg_sq", "grad")


def zero1(total, world):
    return flat_layout({state: shard_ranges(total, world) for state in STATES})


@pytest.mark.parametrize("total,old_world,new_world,expected", [
    pytest.param(10, 2, 1, [(0, 0, 0, 5), (1, 0, 5, 5)], id="dp2-to-dp1"),
    pytest.param(10, 1, 2, [(0, 0, 0, 5), (0, 1, 5, 5)], id="dp1-to-dp2"),
    pytest.param(9, 2, 3, [(0, 0, 0, 3), (0, 1, 3, 2), (1, 1, 5, 1), (1, 2, 6, 3)], id="uneven-2-to-3"),
    pytest.param(4, 2, 2, [(0, 0, 0, 2), (1, 1, 2, 2)], id="same-layout"),
])
def test_flat_plans_table(total, old_world, new_world, expected):
    extents = {"master": (total,)}
    old = flat_layout({"master": shard_ranges(total, old_world)})
    new = flat_layout({"master": shard_ranges(total, new_world)})
    plan = plan_reshard(old, new, extents)
    assert [(t.src, t.dst, t.offset[0], t.shape[0]) for t in plan] == expected


def test_tp2_column_split_to_tp1():
    """A [4, 6] weight split by columns over 2 TP ranks, gathered onto one rank."""
    extents = {"w": (4, 6)}
    old = [Shard("w", 0, (0, 0), (4, 3)), Shard("w", 1, (0, 3), (4, 3))]
    new = [Shard("w", 0, (0, 0), (4, 6))]
    plan = plan_reshard(old, new, extents)
    assert plan == [Transfer("w", 0, 0, (0, 0), (4, 3)), Transfer("w", 1, 0, (0, 3), (4, 3))]


def test_tp2_rows_to_tp2_columns_moves_quarters():
    extents = {"w": (4, 4)}
    rows = [Shard("w", 0, (0, 0), (2, 4)), Shard("w", 1, (2, 0), (2, 4))]
    cols = [Shard("w", 0, (0, 0), (4, 2)), Shard("w", 1, (0, 2), (4, 2))]
    plan = plan_reshard(rows, cols, extents)
    assert sorted((t.src, t.dst) for t in plan) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(t.shape == (2, 2) for t in plan)


@pytest.mark.parametrize("shards,message", [
    pytest.param([Shard("w", 0, (0,), (4,)), Shard("w", 1, (2,), (2,))], "overlap", id="overlap-same-volume"),
    pytest.param([Shard("w", 0, (0,), (4,))], "cover 4 elements of 6", id="gap"),
    pytest.param([Shard("w", 0, (0,), (7,))], "outside", id="outside"),
])
def test_bad_layouts_are_rejected(shards, message):
    with pytest.raises(LayoutError, match=message):
        check_tiling(shards, (6,))


def test_unknown_key_rejected():
    with pytest.raises(LayoutError, match="unknown key"):
        plan_reshard([Shard("x", 0, (0,), (2,))], [], {"w": (2,)})


@settings(max_examples=200)
@given(total=st.integers(0, 5000), old_world=st.integers(1, 16), new_world=st.integers(1, 16))
def test_every_element_of_every_state_is_sent_exactly_once(total, old_world, new_world):
    extents = {state: (total,) for state in STATES}
    plan = plan_reshard(zero1(total, old_world), zero1(total, new_world), extents)
    for state in STATES:
        counts = [0] * total
        for t in plan:
            if t.key == state:
                for i in range(t.offset[0], t.offset[0] + t.shape[0]):
                    counts[i] += 1
        assert counts == [1] * total
    new_ranges = shard_ranges(total, new_world)
    for t in plan:  # each piece lands inside its destination's range
        start, end = new_ranges[t.dst]
        assert start <= t.offset[0] and t.offset[0] + t.shape[0] <= end


@st.composite
def grid_split(draw, extent):
    """Random tiling of a 2-D extent: a grid of row cuts x column cuts, ranks shuffled."""
    rows = sorted(set(draw(st.lists(st.integers(1, extent[0] - 1), max_size=3)))) if extent[0] > 1 else []
    cols = sorted(set(draw(st.lists(st.integers(1, extent[1] - 1), max_size=3)))) if extent[1] > 1 else []
    r_bounds = [0, *rows, extent[0]]
    c_bounds = [0, *cols, extent[1]]
    boxes = [((r0, c0), (r1 - r0, c1 - c0)) for r0, r1 in zip(r_bounds, r_bounds[1:])
             for c0, c1 in zip(c_bounds, c_bounds[1:])]
    ranks = draw(st.permutations(range(len(boxes))))
    return [Shard("w", rank, off, shape) for rank, (off, shape) in zip(ranks, boxes)]


@settings(max_examples=150)
@given(st.data(), st.tuples(st.integers(1, 12), st.integers(1, 12)))
def test_nd_plans_cover_every_element_once(data, extent):
    old = data.draw(grid_split(extent))
    new = data.draw(grid_split(extent))
    plan = plan_reshard(old, new, {"w": extent})
    grid = [[0] * extent[1] for _ in range(extent[0])]
    for t in plan:
        for r in range(t.offset[0], t.offset[0] + t.shape[0]):
            for c in range(t.offset[1], t.offset[1] + t.shape[1]):
                grid[r][c] += 1
    assert all(v == 1 for row in grid for v in row)
    assert sum(t.numel for t in plan) == prod(extent)
