NUM_GPUS = 0

import pytest

from dynarl.components.placement.plan import COMPONENTS, PlacementError, from_pools

R, I, T = "rollout", "inference", "trainer"


def rank_devices(placement):
    return {c: placement.rank_devices(c) for c in COMPONENTS}


@pytest.mark.parametrize("mode,devices,ranks,pools,expected", [
    pytest.param("colocated", 2, (2, 2, 2), None, {R: [0, 1], I: [0, 1], T: [0, 1]}, id="colocated-all-share-all"),
    pytest.param("colocated", 4, (1, 2, 4), None, {R: [0], I: [0, 1], T: [0, 1, 2, 3]}, id="colocated-uneven-ranks"),
    pytest.param("spatial", 3, (1, 1, 1), None, {R: [0], I: [1], T: [2]}, id="spatial-one-each"),
    pytest.param("spatial", 8, (4, 1, 2), None, {R: [0, 1, 2, 3], I: [4], T: [5, 6]}, id="spatial-blocks-in-order"),
    pytest.param("hybrid", 2, (1, 1, 1), None, {R: [0], I: [1], T: [1]}, id="hybrid-default-pools"),
    pytest.param("hybrid", 4, (2, 1, 2), None, {R: [0, 1], I: [2], T: [2, 3]}, id="hybrid-pool-as-wide-as-widest"),
    pytest.param("hybrid", 3, (1, 1, 2), [[R, I], [T]], {R: [0], I: [0], T: [1, 2]}, id="hybrid-custom-pools"),
    pytest.param("hybrid", 3, (1, 1, 2), [[T], [I, R]], {R: [0], I: [0], T: [1, 2]}, id="hybrid-pools-in-chain-order"),
])
def test_placement_table(mode, devices, ranks, pools, expected):
    assert rank_devices(from_pools(mode, devices, dict(zip((R, I, T), ranks)), pools)) == expected


@pytest.mark.parametrize("mode,devices,ranks,pools,message", [
    pytest.param("spatial", 2, (1, 1, 1), None, "needs 1 (rollout) + 1 (inference) + 1 (trainer) = 3 devices",
                 id="spatial-too-few-devices"),
    pytest.param("colocated", 2, (3, 1, 1), None, "= 3 devices but the cluster has 2", id="more-ranks-than-devices"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R], [I]], "in no pool", id="component-missing"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R, I], [I, T]], "more than one pool", id="component-twice"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R, "critic"], [I, T]], "unknown component", id="unknown-component"),
    pytest.param("colocated", 4, (0, 1, 1), None, "at least one rank", id="zero-ranks"),
])
def test_placement_errors(mode, devices, ranks, pools, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        from_pools(mode, devices, dict(zip((R, I, T), ranks)), pools)


def test_shared_devices_are_the_time_shared_ones():
    hybrid = from_pools("hybrid", 3, {R: 1, I: 1, T: 2}, None)
    assert [c for c in COMPONENTS if hybrid.shares_devices(c)] == [I, T]
    assert not any(from_pools("spatial", 3, {R: 1, I: 1, T: 1}).shares_devices(c) for c in COMPONENTS)


def test_ranks_of_several_devices_take_every_unit_th_device():
    """A rollout engine at TP 2 covers two devices; its rank sits on the first."""
    from dynarl.components.placement.plan import spatial
    p = spatial({R: 8, I: 2, T: 6}, unit={R: 2})
    assert p.rank_devices(R) == [0, 2, 4, 6] and p.device_ids(R) == list(range(8))
    assert p.rank_devices(T) == list(range(10, 16))
    with pytest.raises(PlacementError, match="do not fit"):
        spatial({R: 1, I: 1, T: 1}, unit={R: 2})
