NUM_GPUS = 0

import asyncio

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.scheduler.loop import DeviceCounts, GlobalScheduler, device_stats
from dynarl.core.scheduler.manager import ComponentSpec, InterruptGate
from dynarl.core.scheduler.policy import DynarlConfig
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from sched_workers import TimedEngine


def scenario(policy):
    """6 rollout engines: five finish their requests by t=3.5 s, one holds a long tail
    until t=40 s. Inference (2 devices) has a backlog of 50 units per rank at 1 unit/s/device."""
    async def workflow(ctl):
        rollout = await ctl.spawn(TimedEngine, name="rollout", devices=[0, 1, 2, 3, 4, 5])
        inference = await ctl.spawn(TimedEngine, name="inference", devices=[6, 7],
                                    init={"capacity": 100, "backlog": 50.0})
        finish = {p: {f"r{p}": 40.0 if p == 0 else 1.0 + 0.5 * p} for p in range(6)}
        await rollout.scatter("submit", [[finish[p]] for p in range(6)])
        predictor = Predictor({"rollout": ThroughputModel([(1, 1.0)]), "inference": ThroughputModel([(1, 1.0)])})
        sched = GlobalScheduler(ctl, policy, predictor, DynarlConfig(theta=0.8, u_low=0.2, window_s=4.0),
                                interval_s=1.0)
        sched.register(ComponentSpec("rollout", "dynamic", "workload"), rollout)
        sched.register(ComponentSpec("inference", "static", "workload",
                                     init={"capacity": 100, "backlog": 50.0}), inference)
        loop = asyncio.get_running_loop()
        ticker = ctl.spawn_task(sched.run())
        await asyncio.sleep(30.0)
        ticker.cancel()
        done = sorted(x for part in await sched.group("rollout").call("wait_all") for x in part)
        return sched.log, len(sched.group("rollout").devices), len(sched.group("inference").devices), done, loop.time()
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=8))
    return dynarl.run(workflow, config, virtual_time=True)


def test_dynarl_moves_idle_rollout_engines_to_the_bottleneck_and_loses_nothing():
    log, rollout_devices, inference_devices, done, _ = scenario("dynarl")
    assert [m.kind for m in log.migrations] == ["workload", "workload"]  # donor release, receiver grow
    first = log.migrations[0]
    assert first.component == "rollout" and 3.5 + 4.0 <= first.started <= 12.0  # after the window
    assert rollout_devices == 1 and inference_devices == 7
    assert "r0" in done  # the long tail kept running on the engine that was not released
    assert all(d.ms >= 0 for d in log.decisions) and len(log.decisions) >= 20
    # the counts after every move: 6+0 once both are registered, 1+2 after the release, 1+7 after the grow
    assert [c.counts for c in log.counts][1:] == [{"rollout": 6, "inference": 2}, {"rollout": 1, "inference": 2},
                                                  {"rollout": 1, "inference": 7}]
    assert [c.at for c in log.counts[-2:]] == [first.started + first.seconds,
                                              log.migrations[1].started + log.migrations[1].seconds]


def test_static_policy_never_moves():
    log, rollout_devices, inference_devices, _, _ = scenario("static")
    assert log.migrations == [] and rollout_devices == 6 and inference_devices == 2


def test_same_seed_same_schedule():
    first, second = scenario("dynarl"), scenario("dynarl")
    key = lambda log: [(m.kind, m.component, m.devices, round(m.started, 6)) for m in log.migrations]
    assert key(first[0]) == key(second[0])


async def test_interrupt_waits_for_busy_sections():
    gate = InterruptGate()
    events = []

    async def work():
        async with gate.busy():
            events.append("busy-in")
            await asyncio.sleep(0.05)
            events.append("busy-out")

    async def move():
        await asyncio.sleep(0.01)
        async with gate.interrupt():
            events.append("moving")

    await asyncio.gather(work(), move())
    assert events == ["busy-in", "busy-out", "moving"] and gate.interruptible


def test_unknown_policy_rejected():
    with pytest.raises(ValueError, match="static or dynarl"):
        GlobalScheduler(None, "random", Predictor())


COUNTS = [DeviceCounts(0.0, {"rollout": 4, "trainer": 2}), DeviceCounts(10.0, {"rollout": 2, "trainer": 2}),
          DeviceCounts(12.0, {"rollout": 2, "trainer": 4}), DeviceCounts(20.0, {"rollout": 4, "trainer": 2})]


@pytest.mark.parametrize("start, end, rollout, trainer", [
    # window, (mean, min, max) of each
    (0.0, 10.0, (4.0, 4, 4), (2.0, 2, 2)),           # before any move
    (0.0, 20.0, (3.0, 2, 4), (2.8, 2, 4)),           # 4x10 + 2x10; 2x12 + 4x8
    (5.0, 15.0, (3.0, 2, 4), (2.6, 2, 4)),           # opens on the sample before it: 4x5 + 2x5; 2x7 + 4x3
    (11.0, 11.0, (2.0, 2, 2), (2.0, 2, 2)),          # empty window: the count at its start
    (25.0, 30.0, (4.0, 4, 4), (2.0, 2, 2)),          # after the last move
    (0.0, 40.0, (3.5, 2, 4), (2.4, 2, 4)),           # 4x10 + 2x10 + 4x20; 2x12 + 4x8 + 2x20
])
def test_device_stats_are_the_time_weighted_counts_of_the_window(start, end, rollout, trainer):
    stats = device_stats(COUNTS, start, end)
    for name, (mean, low, high) in (("rollout", rollout), ("trainer", trainer)):
        assert stats[name] == {"mean": pytest.approx(mean), "min": low, "max": high}


def test_device_stats_need_a_count_at_the_windows_start():
    with pytest.raises(ValueError, match="no device counts"):
        device_stats(COUNTS[1:], 5.0, 15.0)
