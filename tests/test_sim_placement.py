NUM_GPUS = 0

import pytest

from dynarl.components.placement import plan as plans
from dynarl.components.placement.drift import drifted
from dynarl.components.placement.plan import Placement, Segment
from dynarl.components.placement.planner import grid_step, plan, segment_window
from dynarl.components.placement.policy import (PlanContext, PolicyUnavailable, Replan, RlinfAuto, Snapshot,
                                                make_policy)
from dynarl.components.placement.profile import StageProfile
from dynarl.components.placement.split import proportional_split

R, I, T = "rollout", "inference", "trainer"


def test_placement_blocks_modes_and_validation():
    p = Placement((Segment((R,), 6), Segment((I, T), 10)))
    assert p.mode == "hybrid" and p.num_devices == 16
    assert p.device_ids(R) == list(range(6)) and p.device_ids(T) == list(range(6, 16))
    assert p.shares_devices(T) and not p.shares_devices(R)
    assert p.describe() == "rollout:6 | inference+trainer:10"
    assert plans.colocated(8).mode == "colocated"
    assert plans.spatial({R: 2, I: 1, T: 1}).mode == "spatial"
    with pytest.raises(ValueError, match="in that order"):
        Placement((Segment((I,), 2), Segment((R, T), 2)))
    with pytest.raises(ValueError, match="0 devices"):
        Placement((Segment((R, I), 0), Segment((T,), 2)))


@pytest.mark.parametrize("work, n, gran, expected", [
    pytest.param({R: 1, I: 1, T: 2}, 64, {}, {R: 16, I: 16, T: 32}, id="proportional"),
    pytest.param({R: 1, I: 1, T: 2}, 64, {R: 8}, {R: 16, I: 16, T: 32}, id="already-whole-engines"),
    pytest.param({R: 10, I: 1, T: 1}, 16, {R: 4}, {R: 12, I: 2, T: 2}, id="rollout-rounded-to-tp"),
    pytest.param({R: 1, I: 0, T: 0}, 8, {R: 2}, {R: 6, I: 1, T: 1}, id="one-unit-minimum"),
    pytest.param({R: 0, I: 0, T: 0}, 9, {}, {R: 3, I: 3, T: 3}, id="no-work-even"),
    pytest.param({R: 5, I: 1, T: 4}, 20, {R: 4}, {R: 8, I: 3, T: 9}, id="coarse-unit-skipped"),
    pytest.param({R: 3, I: 1, T: 6}, 20, {}, {R: 6, I: 2, T: 12}, id="exact"),
    pytest.param({R: 1, I: 1, T: 1}, 10, {}, {R: 4, I: 3, T: 3}, id="remainder-in-chain-order"),
])
def test_proportional_split_table(work, n, gran, expected):
    got = proportional_split(work, n, gran)
    assert got == expected and sum(got.values()) == n
    assert got[R] % gran.get(R, 1) == 0


def test_split_needs_room_for_every_component():
    with pytest.raises(ValueError, match="cannot hold"):
        proportional_split({R: 1, I: 1, T: 1}, 5, {R: 4})


@pytest.mark.parametrize("points, devices, expected", [
    pytest.param(((8, 100.0),), 16, 50.0, id="one-point-linear"),
    pytest.param(((8, 100.0), (32, 25.0)), 16, 50.0, id="power-law-between"),
    pytest.param(((8, 100.0), (32, 25.0)), 64, 12.5, id="extrapolate-up"),
    pytest.param(((8, 100.0), (32, 25.0)), 4, 200.0, id="extrapolate-down"),
    pytest.param(((8, 100.0), (16, 120.0)), 32, 100.0, id="never-slower-with-more"),
])
def test_profile_interpolation_table(points, devices, expected):
    assert StageProfile(points).time_at(devices) == pytest.approx(expected)


@pytest.mark.parametrize("upstream, head, rest, last, expected", [
    pytest.param(None, 10.0, 0.0, 10.0, (0.0, 10.0), id="first-alone"),
    pytest.param(None, 10.0, 5.0, 5.0, (10.0, 15.0), id="first-shared-emits-late"),
    pytest.param((0.0, 80.0), 40.0, 0.0, 40.0, (0.0, 85.0), id="downstream-hides-under-upstream"),
    pytest.param((0.0, 40.0), 80.0, 0.0, 80.0, (0.0, 85.0), id="slower-downstream"),
    pytest.param((70.0, 80.0), 40.0, 0.0, 40.0, (70.0, 111.25), id="late-window-serialises"),
])
def test_segment_window_table(upstream, head, rest, last, expected):
    assert segment_window(upstream, head, rest, last, 8) == pytest.approx(expected)


def linear(seconds_at_64):
    return StageProfile(((64, seconds_at_64),))


@pytest.mark.parametrize("n, gran, profiles, switch, expected, predicted", [
    # rollout stops scaling past 16 devices, heavy trainer: rollout beside a streaming trainer
    pytest.param(64, {R: 2}, {R: StageProfile(((8, 400.0), (16, 100.0), (64, 100.0))), I: linear(10.0),
                              T: linear(100.0)}, 2.0, "rollout:14 | inference:6 | trainer:44", 163.4477,
                 id="rollout-stops-scaling-spatial"),
    # everything scales linearly and switching is free: time-share all devices
    pytest.param(64, {R: 2}, {R: linear(100.0), I: linear(10.0), T: linear(100.0)}, 0.0,
                 "rollout+inference+trainer:64", 210.0, id="linear-free-switch-colocated"),
    # the same with costly switches: pipelining pays for itself
    pytest.param(64, {R: 2}, {R: linear(100.0), I: linear(10.0), T: linear(100.0)}, 20.0,
                 "rollout:32 | inference:4 | trainer:28", 256.0714, id="costly-switch-spatial"),
    # heavy inference, light trainer, coarse units: they share a block beside rollout
    pytest.param(16, {R: 4, I: 4, T: 4}, {R: StageProfile(((4, 400.0), (8, 100.0), (16, 100.0))),
                                          I: StageProfile(((16, 60.0),)), T: StageProfile(((16, 20.0),))},
                 1.0, "rollout:8 | inference+trainer:8", 174.5, id="hybrid"),
])
def test_planner_table(n, gran, profiles, switch, expected, predicted):
    result = plan(profiles, n, granularity=gran, switch_s=switch, micro_batches=8)
    assert result.placement.describe() == expected
    assert result.predicted_s == pytest.approx(predicted, rel=1e-5)
    assert result.stage_s[T] == pytest.approx(profiles[T].time_at(result.placement.num_devices_of(T)))


def test_planner_search_stays_small_at_4096_devices():
    profiles = {R: StageProfile(((512, 900.0), (4096, 300.0))), I: linear(48.0), T: linear(140.0)}
    result = plan(profiles, 4096, granularity={R: 2}, switch_s=2.0)
    assert grid_step(4096, {R: 2}) == 64
    assert result.evaluated < 100_000
    assert result.placement.num_devices == 4096
    assert all(s.devices % 64 == 0 for s in result.placement.segments)


@pytest.mark.parametrize("predicted, measured, expected", [
    pytest.param({R: 100.0, T: 50.0}, {R: 114.0, T: 50.0}, [], id="within"),
    pytest.param({R: 100.0, T: 50.0}, {R: 116.0, T: 40.0}, [R, T], id="both-ways"),
    pytest.param({R: 100.0}, {T: 500.0}, [], id="nothing-to-compare"),
    pytest.param({I: 0.0}, {I: 1.0}, [I], id="from-zero"),
])
def test_drift_table(predicted, measured, expected):
    assert drifted(predicted, measured, 0.15) == expected


def ctx(**kw):
    base = dict(num_devices=64, granularity={R: 2}, work={R: 1.0, I: 1.0, T: 2.0}, switch_s=2.0, micro_batches=8)
    return PlanContext(**{**base, **kw})


def test_registry_knows_the_baselines_dynarl_and_its_variants():
    assert make_policy("colocated").place(ctx()).mode == "colocated"
    assert make_policy("spatial").place(ctx()).describe() == "rollout:16 | inference:16 | trainer:32"
    for name in ("dynarl", "dynarl-costaware", "dynarl-consolidate"):
        p = make_policy(name)
        assert p.name == name and p.scheduler(engines=30)["interval_s"] == 1.0
        # rollout takes all but the fewest devices the others need, in whole engines
        assert p.place(ctx(min_devices={T: 2})).describe() == "rollout:60 | inference:1 | trainer:3"
    assert PolicyUnavailable  # still the error type for policies a build cannot run
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("fastest")


def test_rlinf_replans_when_a_stage_drifts_and_not_otherwise():
    profiles = {R: StageProfile(((16, 100.0), (64, 100.0))), I: linear(10.0), T: linear(100.0)}
    policy = RlinfAuto()
    placement = policy.place(ctx(profiles=profiles))
    on_plan = {c: policy.predicted[c] * 1.1 for c in (R, I, T)}
    assert policy.decide(Snapshot(0, 1.0, True, placement, stage_s=on_plan)) == []
    assert policy.decide(Snapshot(0, 1.0, False, placement, stage_s={R: 1e6})) == []  # only at iteration ends
    slow = dict(on_plan, rollout=400.0)  # the rollout turns out 4x slower at its allocation
    [decision] = policy.decide(Snapshot(0, 1.0, True, placement, stage_s=slow))
    assert isinstance(decision, Replan) and "rollout" in decision.reason
    assert decision.placement.num_devices_of(R) > placement.num_devices_of(R)
