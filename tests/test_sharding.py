NUM_GPUS = 0

import msgpack
import pytest
from hypothesis import given, strategies as st

from dynarl.components.trainer.base import STATE_NAMES, ParamSpec, StateLayout, shard_ranges


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
