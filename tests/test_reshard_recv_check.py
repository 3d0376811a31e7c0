NUM_GPUS = 0
"""A new rank checks, before any byte moves, that its transfers tile its range of every
state exactly once (components/trainer/reshard.py); a bad plan fails without a transfer."""
import asyncio

import pytest

from dynarl.components.trainer.base import STATE_NAMES
from dynarl.components.trainer.reshard import Resharding


def no_group(name):
    raise AssertionError("the check must fail before the transfer group is touched")


def plan(pieces):
    """[key, src, dst, offset, length, tag] for each state, the same pieces."""
    return [[key, src, 2, offset, length, tag] for key in STATE_NAMES
            for tag, (src, offset, length) in enumerate(pieces)]


@pytest.mark.parametrize("pieces,why", [
    ([(0, 10, 5)], "cover 5 elements of 10"),        # a gap
    ([(0, 10, 5), (1, 16, 5)], "outside"),            # past the range's end
    ([(0, 10, 6), (1, 14, 4)], "overlap"),            # an element twice, the volume hiding the gap
    ([(0, 10, 5), (1, 10, 5)], "overlap"),            # the same piece from two senders
])
def test_an_uneven_plan_is_refused_before_any_transfer(pieces, why):
    with pytest.raises(RuntimeError, match="unevenly") as info:
        asyncio.run(Resharding(no_group, "cpu").recv(None, "g", plan(pieces), 10, 20))
    assert why in str(info.value)
