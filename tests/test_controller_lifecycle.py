"""Lifecycle failure modes of the controller: a rank whose setup() hangs, a cancel
that arrives during shutdown, processes a worker leaves behind, a controller that
dies while its worker is still starting."""
NUM_GPUS = 0

import asyncio
import os
import subprocess
import sys
import time

import pytest

import dynarl
from dynarl import RuntimeConfig
from conftest import assert_reaped
from workers import BlockingSetup, Echo, Parent, SlowTeardown


async def test_a_setup_that_blocks_its_loop_is_reported_not_waited_for():
    config = RuntimeConfig(launcher="local", hang_timeout_s=1.0, spawn_timeout_s=60.0)
    async with dynarl.Controller(config) as ctl:
        started = time.monotonic()
        with pytest.raises(dynarl.WorkerLost, match="event loop blocked"):
            await ctl.spawn(BlockingSetup, num_ranks=1)
        assert time.monotonic() - started < 45  # at the 1 s hang bound, not after setup's 60 s
        assert "blockingsetup" not in ctl.groups
        pids = [h.pid for h in ctl._starting]  # nothing left being started
        assert pids == []


async def test_a_cancel_during_shutdown_still_stops_every_worker():
    pids: list[int] = []
    entered = asyncio.Event()
    controllers = []

    async def job() -> None:
        async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
            controllers.append(ctl)
            group = await ctl.spawn(Echo, num_ranks=2)
            pids.extend(group.pids)
            entered.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(job())
    await asyncio.wait_for(entered.wait(), 30)
    task.cancel()          # leaves the `async with`: shutdown starts
    await asyncio.sleep(0.05)
    task.cancel()          # and is cancelled again in the middle of it
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert len(pids) == 2
    assert_reaped(pids)
    ipc_dir = controllers[0].router._ipc_dir  # the sockets were closed too (a context left open
    assert ipc_dir and not os.path.exists(ipc_dir)  # blocks a later garbage collection forever)


async def test_processes_a_worker_started_go_with_it():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Parent, num_ranks=1)
        child = (await group.call(Parent.start_child))[0]
        pids = group.pids
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # (the child, reparented, is reaped by init)
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.05)
    assert_reaped(pids + [child])


def test_a_worker_whose_launcher_died_before_it_armed_pdeathsig_exits():
    """die_with_parent compares its parent with the launcher's pid: a launcher that
    died during the worker's imports (the worker was reparented) is noticed."""
    code = "from dynarl.launch.worker_main import die_with_parent; die_with_parent(); print('alive')"
    env = {**os.environ, "DYNARL_PARENT_PID": "1"}  # not this child's parent
    gone = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and "alive" not in gone.stdout
    env["DYNARL_PARENT_PID"] = str(os.getpid())
    kept = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert kept.returncode == 0 and "alive" in kept.stdout


SIGTERM_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {tests!r})
import dynarl
from workers import Marker

async def workflow(ctl):
    group = await ctl.spawn(Marker, num_ranks=2, init={{"path": {path!r}}})
    print(" ".join(map(str, group.pids)), flush=True)
    await asyncio.sleep(60)

try:
    dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local"))
except asyncio.CancelledError:
    sys.exit(143)
"""


def test_sigterm_to_the_controller_stops_the_workers_in_order(tmp_path):
    """slurm sends SIGTERM before it kills a job: the workers' teardown must run."""
    import signal
    path = str(tmp_path / "marker")
    script = SIGTERM_SCRIPT.format(tests=os.path.dirname(__file__), path=path)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()
        proc.wait()
    assert all(open(f"{path}.{rank}").read() == "torn down" for rank in range(2))
    assert_reaped(pids)


async def test_groups_stop_side_by_side_at_shutdown(tmp_path):
    """Each teardown takes 1 s: stopped one group after another, the last would begin
    only when the others had ended (and shutdown would take a grace period per group)."""
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        groups = [await ctl.spawn(SlowTeardown, name=f"g{i}", num_ranks=1, init={"path": str(tmp_path / f"g{i}")})
                  for i in range(3)]
        pids = [h.pid for g in groups for h in g.handles]
    spans = [[float(x) for x in (tmp_path / f"g{i}").read_text().split()] for i in range(3)]
    assert max(began for began, _ in spans) < min(ended for _, ended in spans)
    assert_reaped(pids)
