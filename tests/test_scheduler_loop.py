NUM_GPUS = 0
"""The GlobalScheduler (core/scheduler/loop.py) and its Mover (core/migration/mover.py)
on engines whose requests finish at known times, in virtual time: the donor signal,
the view read from the hypergraph, Workload migration out of the donor and the
receiver's running stage taking the freed devices."""

import asyncio

import pytest

import dynarl
from dynarl import ClusterConfig, RuntimeConfig
from dynarl.components.workflows.live import LiveStep
from dynarl.core.migration.mover import Mover
from dynarl.core.scheduler.log import DeviceCounts, device_stats
from dynarl.core.scheduler.loop import GlobalScheduler, StepState
from dynarl.core.scheduler.manager import ComponentSpec, InterruptGate
from dynarl.core.scheduler.policy import DynarlConfig, Plan
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from dynarl.core.scheduler.view import StepWork
from sched_workers import ClosingEngine, TimedEngine


class Rates:
    """One unit of work per second per device, for both components."""

    def predictor(self, work, progress):
        return Predictor({"rollout": ThroughputModel([(1, 1.0)]), "inference": ThroughputModel([(1, 1.0)])})


class Flow:
    """The workflow side of a move: the joined ranks' stage call returns at once."""
    def __init__(self):
        self.joined = []

    async def releasing(self, component, ranks, parked=False): ...

    async def ready_ranks(self, component, group, positions, version): ...

    def stage_call(self, component, position, version):
        self.joined.append((component, position))

        async def call():
            return None
        return call()


def scenario(policy, tail_s=40.0, stage_done_at=None):
    """6 rollout engines: five finish their requests by t=3.5 s, one holds a long tail
    until t=`tail_s`. Inference (2 devices) has 400 sequence tokens left to process.
    `stage_done_at`: the rollout's stage (live.done) ends then (else it never does)."""
    async def workflow(ctl):
        rollout = await ctl.spawn(TimedEngine, name="rollout", devices=[0, 1, 2, 3, 4, 5])
        inference = await ctl.spawn(TimedEngine, name="inference", devices=[6, 7], init={"capacity": 100})
        finish = {p: {f"r{p}": tail_s if p == 0 else 1.0 + 0.5 * p} for p in range(6)}
        await rollout.scatter(TimedEngine.submit, [[finish[p]] for p in range(6)])
        sched = GlobalScheduler(ctl, policy, Rates(), DynarlConfig(theta=0.8, u_low=0.2, window_s=4.0),
                                interval_s=1.0)
        sched.register(ComponentSpec("rollout", "dynamic"), rollout)
        sched.register(ComponentSpec("inference", "static", "join"), inference)
        flow = Flow()
        sched.mover = Mover(ctl, flow, sched.managers, sched.log)
        loop = asyncio.get_running_loop()
        live = LiveStep(0)
        live.done = {c: loop.create_future() for c in ("rollout", "reward", "inference")}
        if stage_done_at is not None:
            async def stage_ends():
                await asyncio.sleep(stage_done_at)
                await rollout.call(TimedEngine.end_run)
                live.done["rollout"].set_result([])
            ender = ctl.spawn_task(stage_ends())
        sched.start()
        ticker = ctl.spawn_task(sched.run(StepState(live, StepWork(samples=40, prompt_mean=0.0, cap=None))))
        await asyncio.sleep(30.0)
        stopped = loop.time()
        sched.stop()
        await ticker
        if stage_done_at is not None:
            await ender
        assert loop.time() == stopped  # a waiting ticker ends at once
        done = sorted(x for part in await sched.group("rollout").call(TimedEngine.wait_all) for x in part)
        return (sched.log, len(sched.group("rollout").devices), len(sched.group("inference").devices), done,
                flow.joined)
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=8))
    return dynarl.run(workflow, config, virtual_time=True)


def test_dynarl_moves_idle_rollout_engines_to_the_bottleneck_and_loses_nothing():
    log, rollout_devices, inference_devices, done, joined = scenario("dynarl")
    assert [(m.kind, m.component) for m in log.migrations] == [("workload", "rollout"), ("workload", "inference")]
    first = log.migrations[0]
    assert 3.5 + 4.0 <= first.started <= 12.0  # after the window
    assert rollout_devices == 1 and inference_devices == 7
    assert joined == [("inference", p) for p in range(2, 7)]  # each new rank joined the running stage
    assert "r0" in done  # the long tail kept running on the engine that was not released
    assert all(d.ms >= 0 for d in log.decisions) and len(log.decisions) >= 20
    # ownership after every change: 6+2 at the start, 1+2 after the release (5 in flight), 1+7 after the grow
    assert [c.counts for c in log.counts] == [{"rollout": 6, "inference": 2}, {"rollout": 1, "inference": 2},
                                              {"rollout": 1, "inference": 7}]
    assert log.counts[-1].at == pytest.approx(log.migrations[1].started + log.migrations[1].seconds)


def test_a_rollout_whose_stage_is_over_gives_its_idle_devices_to_the_bottleneck():
    """The rollout finished its step early (every engine idle by t=4 s, its stage over at
    t=5 s) while inference still works: its engines are donors (all of them idle, the
    low window past), not left idle until the step's end."""
    log, rollout_devices, inference_devices, _, _ = scenario("dynarl", tail_s=4.0, stage_done_at=5.0)
    assert [(m.kind, m.component) for m in log.migrations] == [("workload", "rollout"), ("workload", "inference")]
    assert rollout_devices == 1 and inference_devices == 7
    assert log.migrations[0].started >= 5.0


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
        GlobalScheduler(None, "random", Rates())


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


@pytest.mark.parametrize("active, utilization, width, devices, release", [
    pytest.param([True, False, True], [0.5, 0.0, 0.1], [1, 1, 1], 2, [1, 2], id="finished-first-then-the-emptiest"),
    pytest.param([True, True, True], [0.3, 0.1, 0.2], [1, 1, 1], 8, [1, 2], id="never-all"),
    pytest.param([True, False, False], [0.3, 0.0, 0.0], [1, 1, 1], 8, [1, 2], id="the-finished-go-the-generating-one-stays"),
    pytest.param([True, True], [0.3, 0.1], [2, 2], 3, [1], id="whole-engines-within-the-devices"),
    pytest.param([True, True, True], [0.1, 0.2, 0.3], [4, 2, 2], 2, [1], id="a-wider-engine-that-does-not-fit-is-skipped"),
    pytest.param([True, True], [0.3, 0.1], [2, 2], 1, [], id="less-than-an-engine-moves-nothing"),
])
def test_release_order(active, utilization, width, devices, release):
    from dynarl.core.migration.holdings import release_order
    assert release_order(active, utilization, width, devices) == release


def test_a_move_whose_kept_engine_finished_meanwhile_releases_that_engine_instead():
    """The decision saw both engines generating and chose to release the emptier one
    (engine 0, 1 request of 4); by the move, engine 1 had finished, so the Workload
    migration has no kept engine to hand engine 0's request to and refuses. The mover
    asks the engines again and releases the finished engine 1 instead: the devices move
    (the megatron example's one step in ten without a move), engine 0's request stays."""
    async def workflow(ctl):
        rollout = await ctl.spawn(ClosingEngine, name="rollout", devices=[0, 1])
        inference = await ctl.spawn(TimedEngine, name="inference", devices=[2], init={"capacity": 100})
        await rollout.scatter(TimedEngine.submit, [[{"long": 10.0}], [{"a": 1.0, "b": 1.0}]])
        sched = GlobalScheduler(ctl, "dynarl", Rates(), DynarlConfig(), interval_s=1.0)
        sched.register(ComponentSpec("rollout", "dynamic"), rollout)
        sched.register(ComponentSpec("inference", "static", "join"), inference)
        sched.mover = Mover(ctl, Flow(), sched.managers, sched.log)
        await sched.managers["rollout"].poll(0.0)  # both generating: engine 0 is the emptier
        await asyncio.sleep(2.0)  # engine 1 finishes at t=1
        live = LiveStep(0)
        live.done = {c: asyncio.get_running_loop().create_future() for c in ("rollout", "reward", "inference")}
        await sched.mover.execute(Plan({"rollout": 1, "inference": 2}, (("rollout", "inference", 1),), 1.0, 2.0, 1),
                                  live)
        left = [x for part in await sched.group("rollout").call(TimedEngine.submit, {}) for x in [part]]
        return sched.log, sched.group("rollout").devices, sched.group("inference").devices, left
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=3))
    log, rollout_devices, inference_devices, left = dynarl.run(workflow, config, virtual_time=True)
    assert [(m.kind, m.component, m.devices) for m in log.migrations] == [("workload", "rollout", [1]),
                                                                         ("workload", "inference", [1])]
    assert len(log.failures) == 1 and "no kept rank can take work" in log.failures[0]
    assert rollout_devices == [0] and inference_devices == [2, 1]
    assert left == [1]  # engine 0 kept its request


@pytest.mark.parametrize("fails", [False, True], ids=["moved", "grow-fails"])
def test_a_barrier_plan_gives_every_finished_device_and_restore_takes_them_back(fails):
    """At the barrier: 3 finished rollout engines (two parked, the last one lent) and
    inference's 2 ranks (lent) go to the barrier trainer, in its units of 2 (one inference
    device is left out: 5 -> 4); restore brings every device home and the lent ranks
    take their memory back. If the trainer's grow fails (its ranks could not start),
    the devices wait in flight until restore, which still brings them all home."""
    from dynarl.core.migration.p2p import MigrationFailed

    async def workflow(ctl):
        rollout = await ctl.spawn(ClosingEngine, name="rollout", devices=[0, 1, 2])
        inference = await ctl.spawn(TimedEngine, name="inference", devices=[3, 4])
        trainer = await ctl.spawn(TimedEngine, name="trainer", devices=[5, 6])
        sched = GlobalScheduler(ctl, "dynarl", Rates(), DynarlConfig(), interval_s=1.0)
        sched.register(ComponentSpec("rollout", "dynamic"), rollout)
        sched.register(ComponentSpec("inference", "static", "join"), inference)
        sched.register(ComponentSpec("trainer", "static", "join", barrier=True, unit=2), trainer)
        mover = sched.mover = Mover(ctl, Flow(), sched.managers, sched.log)
        if fails:
            async def grow(target, devices, live):
                raise MigrationFailed("the trainer's new ranks could not start")
            mover.grow = grow
        live = LiveStep(0, later={"trainer"})
        live.done = {c: asyncio.get_running_loop().create_future() for c in ("rollout", "reward", "inference")}
        plan = Plan({"rollout": 0, "inference": 0, "trainer": 7}, (("rollout", "trainer", 3),
                                                                  ("inference", "trainer", 2)), 1.0, 2.0, 1,
                    barrier=True)
        try:
            await mover.execute(plan, live)
        except MigrationFailed:
            assert fails
        during = dict(mover.holdings.counts)
        lent = {n: await sched.group(n).call(TimedEngine.lent_now) for n in ("rollout", "inference")}
        await mover.restore(lend=False)
        back = {n: await sched.group(n).call(TimedEngine.lent_now) for n in ("rollout", "inference")}
        return during, lent, back, dict(mover.holdings.counts), mover.holdings.barrier_lent, \
            [(m.kind, m.component, m.devices) for m in sched.log.migrations]
    config = RuntimeConfig(launcher="inproc", cluster=ClusterConfig(devices_per_node=7))
    during, lent, back, home, barrier_lent, moves = dynarl.run(workflow, config, virtual_time=True)
    assert lent == {"rollout": [1], "inference": [1, 0]}  # the last engine and inference's first rank
    if fails:  # the parked engines and the lent devices are owned by no one until restore
        assert during == {"rollout": 0, "inference": 1, "trainer": 2}
    else:
        assert during == {"rollout": 0, "inference": 1, "trainer": 6}
        assert ("workload", "trainer", [0, 1, 2, 3]) in moves
    assert moves[:2] == [("workload", "rollout", [0, 1]), ("switch", "rollout", [2])]
    assert ("switch", "inference", [3]) in moves
    assert back == {"rollout": [0, 0, 0], "inference": [0, 0]} and barrier_lent == {}  # (the parked engines rejoined)
    assert home == {"rollout": 3, "inference": 2, "trainer": 2}
