"""The Mover's plans as pure functions of who holds which device (core/migration/holdings.py)."""
import pytest

from dynarl.core.migration.holdings import Holdings, Restore, barrier_shares, lend_firsts, restore_plan

H = Holdings({"rollout": 4, "inference": 2})


@pytest.mark.parametrize("home, tp, firsts", [
    ([4, 5, 6, 7], 2, [4, 6]),
    ([4, 5, 7], 2, [4]),          # 5 and 7 are not one engine's devices
    ([4, 6], 2, []),
    ([4, 5, 6], 1, [4, 5, 6]),
])
def test_lend_firsts(home, tp, firsts):
    assert lend_firsts(home, tp) == firsts


@pytest.mark.parametrize("freed, held, own, wanted, unit, devices, lent", [
    # the rollout's freed engines and inference's two ranks, to a trainer of units of 2: one inference device stays
    ([0, 1], {"rollout": [2], "inference": [3, 4]}, {5, 6}, {"rollout": 1, "inference": 2}, 2,
     [0, 1], {"rollout": [2], "inference": [3]}),
    ([0, 1], {"inference": [3, 4]}, set(), {"inference": 2}, 2, [0, 1], {"inference": [3, 4]}),
    ([0], {}, set(), {}, 2, [], {}),                                   # a freed device left over waits in flight
    ([], {"inference": [3, 5]}, {5}, {"inference": 2}, 1, [], {"inference": [3]}),  # the target's own stay
])
def test_barrier_shares(freed, held, own, wanted, unit, devices, lent):
    assert barrier_shares(freed, held, own, wanted, unit) == (devices, lent)


@pytest.mark.parametrize("h, p2p_at, extra, firsts, plan", [
    (H, {}, {"inference": []}, [0, 2], Restore((), {}, {"inference": ()}, (), (), ())),
    # a parked engine rejoins; inference's extra rank is parked; the trainer reshards home
    (H, {"trainer": [8, 9, 0]}, {"inference": [2]}, [2],
     Restore(("trainer",), {}, {"inference": (2,)}, (), (0,), ())),
    # lent engines (on 4 and 6) are parked; a wide engine (0-3) restarts at the base TP
    (Holdings(H.counts, lent=(4, 6), parked=("inference",), wide={0: (0, 1, 2, 3)}), {}, {}, [0, 4, 6],
     Restore((), {}, {}, (4, 6), (2,), (0,))),  # (2 rejoins before the wide engine stops)
    (Holdings(H.counts, barrier_lent={"inference": (4,)}), {}, {}, [0, 2], Restore((), {"inference": (4,)}, {}, (), (), ())),
])
def test_restore_plan(h, p2p_at, extra, firsts, plan):
    home = {"rollout": [0, 1, 2, 3], "inference": [4, 5, 6, 7], "trainer": [8, 9]}
    assert restore_plan(h, home, p2p_at, extra, firsts, "rollout", 2) == plan


def test_holdings_change_and_credit():
    h = H.change(rollout=-2, inference=2)
    assert h.counts == {"rollout": 2, "inference": 4} and H.counts == {"rollout": 4, "inference": 2}
    spent, h = Holdings(H.counts, credit={"inference": 2}).spend_credit("inference")
    assert spent == 2 and h.credit == {}
    assert H.lend_to_barrier("inference", [4]).lend_to_barrier("inference", [5]).barrier_lent == {"inference": (4, 5)}
    assert Holdings(H.counts, wide={0: (0, 1, 2, 3), 4: (4, 5, 6, 7)}).without_wide([0]).wide == {4: (4, 5, 6, 7)}
    assert Holdings(H.counts, wide={0: (0, 1, 2, 3)}).engine_devices(0, 2) == [0, 1, 2, 3]
    assert H.engine_devices(2, 2) == [2, 3]
