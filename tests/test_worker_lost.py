NUM_GPUS = 0

import asyncio
import os
import signal

import pytest

import dynarl
from dynarl import RuntimeConfig
from conftest import assert_reaped
from workers import Echo

HANG_S = 60.0  # bounds a hang only: every loss below is seen in seconds


async def test_sigkilled_worker_surfaces_as_worker_lost_within_bound():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        pids = [r["pid"] for r in await group.call(Echo.hello, 0)]
        loop = asyncio.get_running_loop()
        pending = asyncio.ensure_future(group.call(Echo.sleep, 60))
        await asyncio.sleep(0.1)
        killed_at = loop.time()
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(dynarl.WorkerLost) as info:
            await asyncio.wait_for(pending, HANG_S)
        # the exit is seen as it happens, not after the heartbeat bound (5 s by default):
        # the reason names the exit code, not a missed heartbeat
        assert "exited with code -9" in str(info.value)
        print(f"lost {loop.time() - killed_at:.2f} s after the SIGKILL")
        with pytest.raises(dynarl.WorkerLost):  # later calls fail at once too
            await group.on([1]).call(Echo.hello, 1)
        assert (await group.on([0]).call(Echo.hello, 2))[0]["x"] == 2  # rank 0 unaffected
    assert_reaped(pids)


async def test_hung_worker_is_reported_by_heartbeat_silence():
    """SIGSTOP freezes every thread, the heartbeat thread included; the process
    does not exit, so only the heartbeat bound can catch it."""
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        pid = (await group.call(Echo.hello, 0))[0]["pid"]
        loop = asyncio.get_running_loop()
        pending = asyncio.ensure_future(group.call(Echo.sleep, 60))
        await asyncio.sleep(0.1)
        stopped_at = loop.time()
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(dynarl.WorkerLost, match="no heartbeat"):
                await asyncio.wait_for(pending, HANG_S)
            print(f"lost {loop.time() - stopped_at:.2f} s after the SIGSTOP (heartbeat bound 3 s)")
        finally:
            os.kill(pid, signal.SIGCONT)
    assert_reaped([pid])


async def test_busy_worker_is_not_declared_lost():
    """A long synchronous step blocks the worker's loop, but the heartbeat thread
    keeps beating: busy is not lost (until hang_timeout_s)."""
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        assert await group.call(Echo.block, 4.0) == [0]  # blocked past the heartbeat bound


async def test_loop_blocked_past_hang_bound_is_lost():
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=0.2, heartbeat_timeout_s=3.0,
                           hang_timeout_s=2.0)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        with pytest.raises(dynarl.WorkerLost, match="event loop blocked"):
            await asyncio.wait_for(group.call(Echo.block, 20), HANG_S)


async def test_inproc_kill_surfaces_as_worker_lost():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        pending = asyncio.ensure_future(group.call(Echo.sleep, 60))
        await asyncio.sleep(0)
        ctl.launcher.kill(group.handles[0])
        with pytest.raises(dynarl.WorkerLost):
            await pending


async def test_a_rank_that_goes_silent_while_stopping_does_not_hold_the_shutdown():
    """A rank frozen (or behind a cut link) when the run stops: its stop call ends once
    its heartbeats are missed, not at the grace period, and it is killed at once."""
    grace_s = 30.0
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=0.2, heartbeat_timeout_s=2.0,
                           shutdown_grace_s=grace_s)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        pids = [r["pid"] for r in await group.call(Echo.hello, 0)]
        os.kill(pids[1], signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await ctl.stop_group(group)
        took = loop.time() - began
        assert group.handles[1].lost is None  # a rank gone while stopping is no loss
    assert took < grace_s / 2, took  # at the heartbeat bound (2 s) plus teardown, far from the grace
    assert_reaped(pids)
