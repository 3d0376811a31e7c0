NUM_GPUS = 0

import pytest

from dynarl.components.workflows.placement import PlacementError, plan_placement, shared_devices

R, I, T = "rollout", "inference", "trainer"


@pytest.mark.parametrize("mode,devices,ranks,pools,expected", [
    pytest.param("temporal", 2, (2, 2, 2), None, {R: [0, 1], I: [0, 1], T: [0, 1]}, id="temporal-all-share-all"),
    pytest.param("temporal", 4, (1, 2, 4), None, {R: [0], I: [0, 1], T: [0, 1, 2, 3]}, id="temporal-uneven-ranks"),
    pytest.param("spatial", 3, (1, 1, 1), None, {R: [0], I: [1], T: [2]}, id="spatial-one-each"),
    pytest.param("spatial", 8, (4, 1, 2), None, {R: [0, 1, 2, 3], I: [4], T: [5, 6]}, id="spatial-blocks-in-order"),
    pytest.param("hybrid", 2, (1, 1, 1), None, {R: [0], I: [1], T: [1]}, id="hybrid-default-pools"),
    pytest.param("hybrid", 4, (2, 1, 2), None, {R: [0, 1], I: [2], T: [2, 3]}, id="hybrid-pool-as-wide-as-widest"),
    pytest.param("hybrid", 3, (1, 1, 2), [[R, I], [T]], {R: [0], I: [0], T: [1, 2]}, id="hybrid-custom-pools"),
])
def test_placement_table(mode, devices, ranks, pools, expected):
    assert plan_placement(mode, devices, dict(zip((R, I, T), ranks)), pools) == expected


@pytest.mark.parametrize("mode,devices,ranks,pools,message", [
    pytest.param("spatial", 2, (1, 1, 1), None, "needs 1 (rollout) + 1 (inference) + 1 (trainer) = 3 devices",
                 id="spatial-too-few-devices"),
    pytest.param("temporal", 2, (3, 1, 1), None, "= 3 devices but the cluster has 2", id="more-ranks-than-devices"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R], [I]], "in no pool", id="component-missing"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R, I], [I, T]], "more than one pool", id="component-twice"),
    pytest.param("hybrid", 4, (1, 1, 1), [[R, "critic"], [I, T]], "unknown component", id="unknown-component"),
    pytest.param("temporal", 4, (0, 1, 1), None, "at least one rank", id="zero-ranks"),
])
def test_placement_errors(mode, devices, ranks, pools, message):
    with pytest.raises(PlacementError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        plan_placement(mode, devices, dict(zip((R, I, T), ranks)), pools)


def test_shared_devices_are_the_time_shared_ones():
    plan = plan_placement("hybrid", 3, {R: 1, I: 1, T: 2}, None)
    assert shared_devices(plan) == {1: [I, T]}
    assert shared_devices(plan_placement("spatial", 3, {R: 1, I: 1, T: 1})) == {}
