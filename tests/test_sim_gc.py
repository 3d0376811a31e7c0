"""launch/sim/runner.few_collections: a run's collector settings, restored after."""
import gc

import pytest

from dynarl.launch.sim.runner import GC_THRESHOLD, few_collections


@pytest.mark.parametrize("raises", [False, True])
def test_few_collections_freezes_and_restores(raises):
    before = gc.get_threshold()
    kept = [object() for _ in range(10)]
    try:
        with few_collections():
            assert gc.get_threshold() == GC_THRESHOLD
            assert gc.get_freeze_count() >= len(kept)
            if raises:
                raise RuntimeError("the run failed")
    except RuntimeError:
        assert raises
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
