NUM_GPUS = 0

import pytest

from dynarl.core.devices import resolve_placement


@pytest.mark.parametrize("num_devices,load,num_ranks,devices,expected", [
    pytest.param(4, {}, 2, None, [0, 1], id="empty-pool-lowest-ids"),
    pytest.param(4, {0: 1, 1: 1}, 2, None, [2, 3], id="spread-before-sharing"),
    pytest.param(4, {0: 1, 1: 1, 2: 1, 3: 1}, 4, None, [0, 1, 2, 3], id="share-when-full"),
    pytest.param(4, {0: 2, 1: 1, 2: 0, 3: 1}, 2, None, [1, 2], id="least-loaded-then-lowest-id"),
    pytest.param(4, {}, None, [3, 1], [3, 1], id="explicit-order-kept"),
    pytest.param(2, {}, None, [0, 0], [0, 0], id="explicit-sharing"),
])
def test_placement_table(num_devices, load, num_ranks, devices, expected):
    assert resolve_placement(num_devices, load, num_ranks, devices) == expected


@pytest.mark.parametrize("num_devices,num_ranks,devices,message", [
    pytest.param(2, 3, None, "cluster has 2", id="more-ranks-than-devices"),
    pytest.param(2, None, [5], "out of range", id="bad-device-id"),
    pytest.param(2, 2, [0], "num_ranks=2", id="count-mismatch"),
    pytest.param(2, None, None, "num_ranks", id="nothing-given"),
])
def test_placement_errors(num_devices, num_ranks, devices, message):
    with pytest.raises(ValueError, match=message):
        resolve_placement(num_devices, {}, num_ranks, devices)
