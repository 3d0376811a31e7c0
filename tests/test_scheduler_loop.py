NUM_GPUS = 0

import asyncio

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.core.scheduler.loop import GlobalScheduler
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
