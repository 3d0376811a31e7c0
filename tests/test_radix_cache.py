NUM_GPUS = 0

import pytest

from dynarl.components.rollout.native.radix_cache import RadixCache

BS = 2
# sequences inserted in order; block ids are 10*k + i for sequence k, block i
INSERTS = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8, 9], [1, 2, 9, 9]]


def build(inserts=INSERTS):
    cache = RadixCache(BS)
    kept = []
    for k, tokens in enumerate(inserts):
        kept.append(cache.insert(tokens, [10 * k + i for i in range(len(tokens) // BS + 1)]))
    return cache, kept


def test_insert_keeps_only_new_full_blocks():
    cache, kept = build()
    # seq 1 shares [1,2],[3,4] with seq 0; its trailing [9] is not a full block
    assert kept == [[0, 1, 2], [12], [21]]
    assert cache.num_blocks == 5


@pytest.mark.parametrize("query, blocks", [
    pytest.param([1, 2, 3, 4, 5, 6, 7], [0, 1, 2], id="full-path-plus-tail"),
    pytest.param([1, 2, 3, 4, 7, 8], [0, 1, 12], id="branch"),
    pytest.param([1, 2, 3], [0], id="partial-block-not-matched"),
    pytest.param([1, 2, 3, 5], [0], id="diverge-inside-block"),
    pytest.param([2, 1], [], id="miss"),
    pytest.param([], [], id="empty"),
    pytest.param([1, 2, 9, 9, 9, 9], [0, 21], id="second-branch"),
])
def test_match_prefix(query, blocks):
    cache, _ = build()
    assert cache.match_prefix(query) == blocks


@pytest.mark.parametrize("touch, in_use, num, evicted", [
    pytest.param([], set(), 1, [2], id="lru-leaf-first"),
    pytest.param([], set(), 2, [2, 12], id="two-oldest-leaves"),
    pytest.param([], set(), 3, [2, 12, 1], id="parent-joins-once-childless"),
    pytest.param([], set(), 10, [2, 12, 1, 21, 0], id="everything"),
    pytest.param([[1, 2, 3, 4, 5, 6]], set(), 2, [12, 21], id="touched-path-survives"),
    pytest.param([], {2}, 2, [12, 21], id="in-use-leaf-skipped"),
    pytest.param([], {2, 12}, 5, [21], id="in-use-leaves-pin-ancestors"),
    pytest.param([], {0}, 5, [2, 12, 1, 21], id="in-use-root-child"),
])
def test_evict(touch, in_use, num, evicted):
    cache, _ = build()
    for query in touch:
        cache.match_prefix(query)
    got = cache.evict(num, lambda block: block not in in_use)
    assert got == evicted
    assert cache.num_blocks == 5 - len(evicted)
    for block in got:  # nothing evicted is still reachable
        assert block not in cache.match_prefix([1, 2, 3, 4, 5, 6]) + cache.match_prefix([1, 2, 3, 4, 7, 8]) \
            + cache.match_prefix([1, 2, 9, 9])


def test_match_without_touch_keeps_lru_order():
    cache, _ = build()
    cache.match_prefix([1, 2, 3, 4, 5, 6], touch=False)
    assert cache.evict(1, lambda b: True) == [2]


def test_reinsert_after_evict_and_reset():
    cache, _ = build()
    assert cache.evict(1, lambda b: True) == [2]
    assert cache.insert([1, 2, 3, 4, 5, 6], [7, 8, 9]) == [9]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6]) == [0, 1, 9]
    assert sorted(cache.reset()) == [0, 1, 9, 12, 21]
    assert cache.num_blocks == 0 and cache.match_prefix([1, 2]) == []
