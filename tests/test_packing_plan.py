"""The packing plans (trainer/native/packing.py): which samples share a micro-batch,
which samples a DP rank trains, and TrainBatch.shard_indices(by_tokens=...)."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.packing import balance_parts, plan_micro_batches


@pytest.mark.parametrize("lengths, max_tokens, expected", [
    pytest.param([], 10, [], id="empty"),
    pytest.param([4, 4, 4], 12, [[0, 1, 2]], id="exact_fit"),
    pytest.param([4, 4, 4], 11, [[0, 1], [2]], id="one_over"),
    pytest.param([3, 9, 5, 1], 10, [[1, 3], [0, 2]], id="longest_first"),
    pytest.param([2, 30, 2], 10, [[1], [0, 2]], id="oversized_alone"),
    pytest.param([30, 40], 10, [[1], [0]], id="two_oversized"),
    pytest.param([6, 6, 6, 4, 4, 4], 10, [[0, 3], [1, 4], [2, 5]], id="pairs"),
    pytest.param([5, 5, 5, 5], 10, [[0, 1], [2, 3]], id="ties_by_index"),
    pytest.param([7, 1, 1, 1, 7], 8, [[0, 1], [2, 4], [3]], id="first_fit"),
])
def test_plan_micro_batches_table(lengths, max_tokens, expected):
    assert plan_micro_batches(lengths, max_tokens) == expected


@pytest.mark.parametrize("lengths, max_tokens, message", [
    ([3], 0, "max_tokens"), ([3, -1], 10, r"lengths\[1\]"),
])
def test_plan_micro_batches_rejects(lengths, max_tokens, message):
    with pytest.raises(ValueError, match=message):
        plan_micro_batches(lengths, max_tokens)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=60), st.integers(1, 400))
def test_plan_micro_batches_covers_each_index_once_within_budget(lengths, max_tokens):
    plan = plan_micro_batches(lengths, max_tokens)
    assert sorted(i for group in plan for i in group) == list(range(len(lengths)))
    for group in plan:
        assert group and group == sorted(group)
        assert sum(lengths[i] for i in group) <= max_tokens or len(group) == 1
    assert plan == plan_micro_batches(list(lengths), max_tokens)  # deterministic
    # first fit: no two groups both at most half full could have been one
    light = [g for g in plan if 2 * sum(lengths[i] for i in g) <= max_tokens]
    assert len(light) <= 1


@pytest.mark.parametrize("lengths, group_ids, world, expected", [
    pytest.param([], None, 2, [[], []], id="empty"),
    pytest.param([5, 5, 5, 5], None, 1, [[0, 1, 2, 3]], id="one_rank"),
    pytest.param([5, 5, 5, 5], None, 2, [[0, 1], [2, 3]], id="even"),
    pytest.param([30, 2, 2, 2, 2, 2], None, 2, [[0], [1, 2, 3, 4, 5]], id="long_head"),
    pytest.param([2, 2, 2, 2, 2, 30], None, 2, [[0, 1, 2, 3, 4], [5]], id="long_tail"),
    pytest.param([10, 10, 1, 1, 1, 1], [0, 0, 1, 1, 2, 2], 2, [[0, 1], [2, 3, 4, 5]], id="groups_by_tokens"),
    pytest.param([1, 10, 1, 10, 3, 3], [7, 3, 7, 3, 9, 9], 2, [[0, 1, 2, 3], [4, 5]], id="interleaved_groups"),
    pytest.param([1, 10, 1, 10, 1, 1], [7, 3, 7, 3, 9, 9], 2, [[0, 2], [1, 3, 4, 5]], id="tie_cuts_earlier"),
    pytest.param([9, 9, 9], [0, 0, 1], 3, [[0, 1], [2], []], id="fewer_groups_than_ranks"),
    pytest.param([100, 1, 1, 1], None, 3, [[0], [1], [2, 3]], id="each_rank_one_group"),
    pytest.param([4, 4, 4, 4, 4, 4], None, 3, [[0, 1], [2, 3], [4, 5]], id="three_ranks"),
])
def test_balance_parts_table(lengths, group_ids, world, expected):
    assert balance_parts(lengths, group_ids, world) == expected


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 200), st.integers(1, 4)), max_size=30), st.integers(1, 5))
def test_balance_parts_whole_contiguous_groups(groups, world):
    """Groups of (sample length, size): every sample once, groups whole and in order,
    no rank further above the even share than its heaviest group."""
    lengths = [n for n, size in groups for _ in range(size)]
    ids = [g for g, (_, size) in enumerate(groups) for _ in range(size)]
    parts = balance_parts(lengths, ids, world)
    assert len(parts) == world
    assert [i for part in parts for i in part] == list(range(len(lengths)))
    owners = {}
    for rank, part in enumerate(parts):
        for i in part:
            assert owners.setdefault(ids[i], rank) == rank
    if len(groups) >= world:
        assert all(parts)
        total, heaviest = sum(lengths), max(n * size for n, size in groups)
        for part in parts:
            assert sum(lengths[i] for i in part) <= total / world + 2 * heaviest


@pytest.mark.parametrize("lengths, groups, world", [
    ([8, 8, 3, 3, 3, 3, 40, 40], [0, 0, 1, 1, 2, 2, 3, 3], 2),
    ([5] * 7, None, 3),
])
def test_shard_indices_by_tokens(lengths, groups, world):
    batch = TrainBatch(input_ids=[[3] * n for n in lengths], prompt_lens=[1] * len(lengths),
                       advantages=[0.0] * len(lengths), group_ids=groups)
    by_tokens = [batch.shard_indices(r, world, by_tokens=True) for r in range(world)]
    assert by_tokens == balance_parts(lengths, groups, world)
    assert [batch.shard(r, world, by_tokens=True).input_ids for r in range(world)] == \
        [[batch.input_ids[i] for i in part] for part in by_tokens]


def test_shard_indices_default_still_by_group_count():
    """The default ignores lengths: groups of 40-token samples count as much as 3-token ones."""
    batch = TrainBatch(input_ids=[[3] * n for n in (40, 40, 3, 3, 3, 3)], prompt_lens=[1] * 6,
                       advantages=[0.0] * 6, group_ids=[0, 0, 1, 1, 2, 2])
    assert [batch.shard_indices(r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5]]
    assert [batch.shard_indices(r, 2, by_tokens=True) for r in range(2)] == [[0, 1], [2, 3, 4, 5]]


@pytest.mark.parametrize("value, ok", [(None, True), (0, True), (1, True), (4096, True), (-1, False)])
def test_config_max_tokens_per_micro_batch(value, ok):
    if ok:
        assert TrainerConfig(max_tokens_per_micro_batch=value).max_tokens_per_micro_batch == value
    else:
        with pytest.raises(ValueError, match="max_tokens_per_micro_batch"):
            TrainerConfig(max_tokens_per_micro_batch=value)


def test_config_with_packing_crosses_the_wire():
    from dynarl.transport.wire import decode_blob, encode_blob
    config = TrainerConfig(max_tokens_per_micro_batch=2048, micro_batch_size=4)
    assert decode_blob(encode_blob(config)) == config
