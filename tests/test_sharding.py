NUM_GPUS = 0

import msgpack
import pytest
import torch
from hypothesis import given, strategies as st

from dynarl.components.trainer.base import STATE_NAMES, ParamSpec, StateLayout
from dynarl.components.trainer.native.sharding import (
    flatten, overlaps, param_pieces, shard_ranges, unflatten_into)


@pytest.mark.parametrize("total, world, expected", [
    pytest.param(10, 3, [(0, 4), (4, 7), (7, 10)], id="remainder_to_first_ranks"),
    pytest.param(12, 4, [(0, 3), (3, 6), (6, 9), (9, 12)], id="even"),
    pytest.param(2, 4, [(0, 1), (1, 2), (2, 2), (2, 2)], id="more_ranks_than_elements"),
    pytest.param(0, 2, [(0, 0), (0, 0)], id="empty"),
    pytest.param(7, 1, [(0, 7)], id="single_rank"),
])
def test_shard_ranges_table(total, world, expected):
    assert shard_ranges(total, world) == expected


@pytest.mark.parametrize("total, world", [pytest.param(-1, 2, id="negative_total"),
                                          pytest.param(5, 0, id="zero_world")])
def test_shard_ranges_rejects_bad_args(total, world):
    with pytest.raises(ValueError):
        shard_ranges(total, world)


@given(total=st.integers(0, 10**7), world=st.integers(1, 512))
def test_shard_ranges_cover_once_and_balanced(total, world):
    ranges = shard_ranges(total, world)
    assert len(ranges) == world
    assert ranges[0][0] == 0 and ranges[-1][1] == total
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end == start  # contiguous: every element owned exactly once
    sizes = [e - s for s, e in ranges]
    assert min(sizes) >= 0 and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("start, end, expected", [
    pytest.param(0, 10, [(0, 0, 4), (1, 4, 7), (2, 7, 10)], id="everything"),
    pytest.param(3, 5, [(0, 3, 4), (1, 4, 5)], id="straddles_boundary"),
    pytest.param(4, 7, [(1, 4, 7)], id="exactly_one_rank"),
    pytest.param(5, 5, [], id="empty"),
])
def test_overlaps_table(start, end, expected):
    assert overlaps(shard_ranges(10, 3), start, end) == expected


@given(total=st.integers(0, 5000), old_world=st.integers(1, 17), new_world=st.integers(1, 17), data=st.data())
def test_overlaps_reassemble_any_new_range(total, old_world, new_world, data):
    rank = data.draw(st.integers(0, new_world - 1))
    start, end = shard_ranges(total, new_world)[rank]
    pieces = overlaps(shard_ranges(total, old_world), start, end)
    covered = [i for _, lo, hi in pieces for i in range(lo, hi)]
    assert covered == list(range(start, end))


def test_param_pieces_local_coordinates():
    # params of 6, 4 and 5 elements at offsets 0, 6, 10
    assert param_pieces([0, 6, 10], [6, 4, 5], 4, 12) == [(0, 4, 6), (1, 0, 4), (2, 0, 2)]
    assert param_pieces([0, 6, 10], [6, 4, 5], 6, 10) == [(1, 0, 4)]


def test_flatten_unflatten_roundtrip_with_dtypes_and_missing():
    a, b = torch.randn(2, 3), torch.randn(4).to(torch.bfloat16)
    flat = flatten([a, None, b], [6, 2, 4])
    assert flat.dtype == torch.float32 and flat.numel() == 12
    assert torch.equal(flat[6:8], torch.zeros(2))
    a2, b2 = torch.zeros_like(a), torch.zeros_like(b)
    unflatten_into(flat[[*range(6), *range(8, 12)]], [a2, b2], [0, 6])
    assert torch.equal(a2, a) and torch.equal(b2, b)


def _layout(world: int) -> StateLayout:
    params = (ParamSpec("w", (3, 4), "float32", 0), ParamSpec("b", (4,), "bfloat16", 12))
    return StateLayout(params=params, total_numel=16, world_size=world,
                       shards={s: tuple(shard_ranges(16, world)) for s in STATE_NAMES})


def test_state_layout_wire_roundtrip_through_msgpack():
    layout = _layout(3)
    wire = msgpack.unpackb(msgpack.packb(layout.to_wire()))
    again = StateLayout.from_wire(wire)
    assert again == layout
    assert again.owned("exp_avg", 1) == (6, 11)
    assert again.params[1].numel == 4


@pytest.mark.parametrize("change, message", [
    pytest.param({"total_numel": 17}, "total_numel", id="params_do_not_cover_total"),
    pytest.param({"shards": {"master": ((0, 8), (9, 16))}}, "does not continue", id="gap_between_ranks"),
    pytest.param({"shards": {"master": ((0, 16),)}}, "world_size", id="wrong_rank_count"),
    pytest.param({"params": (ParamSpec("w", (3, 4), "float32", 1),)}, "starts at", id="bad_offset"),
])
def test_state_layout_rejects_inconsistent(change, message):
    fields = {"params": _layout(2).params, "total_numel": 16, "world_size": 2,
              "shards": {"master": ((0, 8), (8, 16))}}
    fields.update(change)
    with pytest.raises(ValueError, match=message):
        StateLayout(**fields)
