NUM_GPUS = 0

import asyncio

import dynarl
from dynarl import RuntimeConfig
from workers import Echo


async def test_device_lock_serialises_two_groups_on_the_same_devices():
    log: list[tuple[str, str]] = []
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        rollout = await ctl.spawn(Echo, name="rollout", devices=[0, 1])
        trainer = await ctl.spawn(Echo, name="trainer", devices=[0, 1])

        async def use(group, rounds):
            for i in range(rounds):
                async with group.device_lock():
                    log.append((group.name, "in"))
                    await group.call(Echo.record, f"work{i}")
                    await asyncio.sleep(0.01)
                    log.append((group.name, "out"))

        await asyncio.gather(use(rollout, 3), use(trainer, 3))
        events = {g.name: (await g.call(Echo.get_events))[0] for g in (rollout, trainer)}
        stats = ctl.locks.statistics()
    # Never both inside at once: every "in" is followed by the same group's "out".
    for (g1, e1), (g2, e2) in zip(log[::2], log[1::2]):
        assert (e1, e2) == ("in", "out") and g1 == g2
    # Turns alternate in request order (FIFO locks), and each turn onloads then offloads.
    assert [g for g, e in log if e == "in"] == ["rollout", "trainer"] * 3
    for name in ("rollout", "trainer"):
        assert events[name] == [x for i in range(3) for x in ("onload", f"work{i}", "offload")]
    assert all(not s["locked"] for s in stats.values())


async def test_groups_on_disjoint_devices_do_not_wait_for_each_other():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        a = await ctl.spawn(Echo, devices=[0])
        b = await ctl.spawn(Echo, devices=[1])
        inside, b_done = asyncio.Event(), asyncio.Event()

        async def hold_a():
            async with a.device_lock():
                inside.set()
                await b_done.wait()  # a's lock is held until b has had its own

        task = asyncio.ensure_future(hold_a())
        await inside.wait()
        try:
            async with asyncio.timeout(60):  # waiting for a's lock would never end
                async with b.device_lock():
                    pass
        finally:
            b_done.set()
        await task


async def test_a_rank_grown_while_the_lock_is_held_is_not_offloaded_by_its_release():
    """The lock covers the devices and ranks it was taken with: a rank added meanwhile
    (a migration's receiver, on devices of its own) keeps working after the release."""
    config = RuntimeConfig(launcher="inproc", cluster=dynarl.ClusterConfig(num_nodes=1, devices_per_node=3))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, name="trainer", devices=[0])
        async with group.device_lock():
            await ctl.grow_group(group, [1])
            await ctl.grow_group(group, [2])
            await ctl.shrink_group(group, [1])  # rank 1 (device 1) leaves while the lock is held
        events = await group.call(Echo.get_events)
    assert events[0] == ["onload", "offload"]  # the holder
    assert events[1] == []  # grown on device 2 meanwhile: neither onloaded nor offloaded by this lock


async def test_the_works_error_is_raised_not_the_offload_that_fails_after_it():
    """A failed stage leaves its engines busy, so their offload fails too: the stage's
    error is what the run reports; the offload's is logged."""
    from workers import StuckOffload
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        group = await ctl.spawn(StuckOffload, devices=[0])
        try:
            async with group.device_lock():
                raise ValueError("the stage failed")
        except ValueError as exc:
            assert str(exc) == "the stage failed"
        else:
            raise AssertionError("the lock swallowed the stage's error")
        try:  # a clean exit still reports its offload's failure
            async with group.device_lock():
                pass
        except Exception as exc:
            assert "offload: work still running" in str(exc)
        else:
            raise AssertionError("the offload's failure was lost")
        assert not ctl.locks.statistics()[next(iter(ctl.locks.statistics()))]["locked"]
