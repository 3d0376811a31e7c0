NUM_GPUS = 0

import pytest

from dynarl.core.data_router import DataRouter, ItemStatus, NoWorkers, WorkerState, route

W = {"a": WorkerState(0.5), "b": WorkerState(0.2), "c": WorkerState(0.95)}


@pytest.mark.parametrize("affinity,home,prefix,workers,expected", [
    pytest.param("none", "a", 100, W, ("b", 0, "least-loaded"), id="none-goes-least-loaded"),
    pytest.param("prefer", "a", 100, W, ("a", 0, "affinity"), id="prefer-home"),
    pytest.param("prefer", "c", 100, W, ("b", 100, "fallback-saturated"), id="prefer-home-saturated"),
    pytest.param("must", "c", 100, W, ("c", 0, "affinity"), id="must-stays-even-saturated"),
    pytest.param("must", "a", 100, {**W, "a": WorkerState(0.5, alive=False)}, ("b", 100, "fallback-gone"),
                 id="must-home-removed-reprefills"),
    pytest.param("prefer", "gone", 40, W, ("b", 40, "fallback-gone"), id="prefer-home-unknown"),
    pytest.param("prefer", None, 40, W, ("b", 0, "least-loaded"), id="first-turn-no-home"),
    pytest.param("none", None, 0, {"x": WorkerState(0.1), "w": WorkerState(0.1)}, ("w", 0, "least-loaded"),
                 id="tie-lowest-id"),
])
def test_route_table(affinity, home, prefix, workers, expected):
    decision = route(ItemStatus(affinity=affinity, last_worker=home, cached_prefix=prefix), workers)
    assert (decision.worker, decision.reprefill_tokens, decision.reason) == expected


def test_no_live_worker():
    with pytest.raises(NoWorkers):
        route(ItemStatus(), {"a": WorkerState(0.0, alive=False)})


def test_router_counts_and_updates_status_after_a_removal():
    router = DataRouter()
    item = ItemStatus(affinity="must")
    first = router.distribute(item, {"a": WorkerState(0.1), "b": WorkerState(0.3)})
    assert first.worker == "a" and item.last_worker == "a"
    item.cached_prefix = 250  # the turn ran on a; its context is cached there
    again = router.distribute(item, {"a": WorkerState(0.9), "b": WorkerState(0.3)})
    assert again.worker == "a" and router.reprefill_tokens == 0
    moved = router.distribute(item, {"a": WorkerState(0.0, alive=False), "b": WorkerState(0.3)})
    assert moved.worker == "b" and router.reprefill_tokens == 250
    assert item.last_worker == "b" and item.cached_prefix == 0
    assert router.by_reason == {"least-loaded": 1, "affinity": 1, "fallback-gone": 1}
