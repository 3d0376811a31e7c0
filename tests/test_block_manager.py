NUM_GPUS = 0

import pytest

from dynarl.components.rollout.native.block_manager import BlockManager, OutOfBlocks


@pytest.mark.parametrize("ops, free_after, error", [
    pytest.param([("alloc", 3)], 1, None, id="alloc-some"),
    pytest.param([("alloc", 4)], 0, None, id="alloc-all"),
    pytest.param([("alloc", 5)], 4, OutOfBlocks, id="alloc-over-capacity"),
    pytest.param([("alloc", 3), ("alloc", 2)], 1, OutOfBlocks, id="second-alloc-over-capacity"),
    pytest.param([("alloc", 2), ("free", 0)], 3, None, id="free-one"),
    pytest.param([("alloc", 2), ("incref", 0), ("free", 0)], 2, None, id="shared-block-stays"),
    pytest.param([("alloc", 2), ("incref", 0), ("free", 0), ("free", 0)], 3, None, id="shared-then-last-ref"),
    pytest.param([("alloc", 4), ("free", 1), ("alloc", 1)], 0, None, id="reuse-freed"),
])
def test_block_manager_ops(ops, free_after, error):
    manager = BlockManager(num_blocks=4, block_size=8)
    held: list[int] = []
    try:
        for op, arg in ops:
            if op == "alloc":
                held += manager.allocate(arg)
            elif op == "free":
                manager.free([held[arg]])
            else:
                manager.incref([held[arg]])
    except OutOfBlocks:
        assert error is OutOfBlocks
    else:
        assert error is None
    assert manager.num_free_blocks == free_after
    assert manager.num_used_blocks + manager.num_free_blocks == 4
    assert sum(1 for c in manager.ref_counts if c > 0) == manager.num_used_blocks


@pytest.mark.parametrize("tokens, blocks", [
    pytest.param(0, 0, id="empty"), pytest.param(1, 1, id="one"), pytest.param(8, 1, id="exact"),
    pytest.param(9, 2, id="spill"), pytest.param(64, 8, id="many"),
])
def test_blocks_for(tokens, blocks):
    assert BlockManager(num_blocks=4, block_size=8).blocks_for(tokens) == blocks


def test_allocation_never_exceeds_capacity():
    manager = BlockManager(num_blocks=10, block_size=4)
    held = []
    for i in range(100):
        n = i % 4 + 1
        if manager.can_allocate(n):
            held.append(manager.allocate(n))
        else:
            with pytest.raises(OutOfBlocks):
                manager.allocate(n)
            manager.free(held.pop(0))
        assert sum(len(h) for h in held) == manager.num_used_blocks <= 10
        assert len({b for h in held for b in h}) == manager.num_used_blocks  # no block handed out twice
    assert manager.capacity_tokens == 40


@pytest.mark.parametrize("kwargs, field", [
    pytest.param({"num_blocks": 0, "block_size": 4}, "num_blocks", id="no-blocks"),
    pytest.param({"num_blocks": 4, "block_size": 0}, "block_size", id="no-block-size"),
])
def test_bad_sizes(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BlockManager(**kwargs)


def test_blocks_go_lowest_first_and_the_high_water_grows_only_past_every_earlier_block():
    grown = []
    bm = BlockManager(8, 4, on_grow=grown.append)
    a = bm.allocate(3)
    b = bm.allocate(2)
    assert (a, b, bm.high_water, grown) == ([0, 1, 2], [3, 4], 5, [3, 5])
    bm.free([1, 0])
    assert bm.allocate(3) == [0, 1, 5] and bm.high_water == 6 and grown == [3, 5, 6]
    bm.free([3])
    assert bm.allocate(1) == [3] and grown == [3, 5, 6]  # reused below the mark: nothing new to zero
