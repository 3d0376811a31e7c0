NUM_GPUS = 0

import asyncio
import os
import sys

import pytest

import dynarl
from dynarl import RuntimeConfig
from conftest import assert_reaped
from workers import Echo

LAUNCHERS = ["local", "inproc"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_spawn_call_shutdown_leaves_no_process(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2, init={"tag": "abc"})
        results = await group.call(Echo.hello, 7)
        assert [r["rank"] for r in results] == [0, 1]
        assert all(r["x"] == 7 and r["tag"] == "abc" and r["world"] == 2 for r in results)
        assert await group.on([0, 1]).call(Echo.hello, 8) == await group.call(Echo.hello, 8)
        assert [r["rank"] for r in await group.on([1]).call(Echo.hello, 1)] == [1]
        assert [r["x"] for r in await group.scatter(Echo.hello, [[10], [11]])] == [10, 11]
        pids = [r["pid"] for r in results]
    if launcher == "local":
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert_reaped(pids)


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_remote_exception_carries_traceback(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        with pytest.raises(dynarl.RemoteError) as info:
            await group.call(Echo.boom)
        assert info.value.type_name == "ValueError"
        assert "bad things happened here" in str(info.value)
        assert "in boom" in info.value.remote_traceback
        with pytest.raises(dynarl.RemoteError, match="no method"):
            await group.handles[0].send("missing")  # the worker refuses a name it lacks
        with pytest.raises(dynarl.RemoteError, match="private"):
            await group.handles[0].send("_bind")
        assert (await group.call(Echo.hello, 1))[0]["x"] == 1  # still serving


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_plain_methods_answer_like_async_ones(launcher):
    """Plain (non-async) methods take the worker's fast path under `local`: same
    results and errors as the task path that `inproc` uses."""
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        assert await group.call(Echo.plain_rank) == [0, 1]
        assert [r["x"] for r in await group.call(Echo.plain_later, 5)] == [5, 5]
        with pytest.raises(dynarl.RemoteError) as info:
            await group.call(Echo.plain_boom)
        assert info.value.type_name == "KeyError" and "in plain_boom" in info.value.remote_traceback
        # interleaved plain and async calls, many in flight: every answer reaches its caller
        calls = [group.call(Echo.plain_rank) if i % 2 else group.call(Echo.hello, i) for i in range(40)]
        results = await asyncio.gather(*calls)
        assert all(r == [0, 1] for r in results[1::2])
        assert [rs[1]["x"] for rs in results[0::2]] == list(range(0, 40, 2))
        assert (await group.call(Echo.hello, 1))[0]["x"] == 1


async def test_unsendable_plain_results_are_errors():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        with pytest.raises(dynarl.RemoteError) as info:
            await group.call(Echo.unsendable)
        assert info.value.type_name == "TypeError" and "cannot send" in str(info.value)
        with pytest.raises(dynarl.RemoteError) as info:
            await asyncio.wait_for(group.call(Echo.deep), 10)
        assert info.value.type_name == "ValueError"
        assert await group.call(Echo.plain_rank) == [0]  # still serving
        pids = group.pids
    assert_reaped(pids)


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_a_property_that_raises_is_an_error_and_the_worker_keeps_serving(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        with pytest.raises(dynarl.RemoteError) as info:
            await asyncio.wait_for(group.handles[0].send("broken"), 10)  # a property, sent by name
        assert info.value.type_name == "RuntimeError" and "property failed" in str(info.value)
        assert await asyncio.wait_for(group.call(Echo.plain_rank), 10) == [0]


async def test_exception_in_user_code_still_reaps_everything():
    pids = []
    with pytest.raises(RuntimeError, match="user bug"):
        async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
            group = await ctl.spawn(Echo, num_ranks=2)
            pids = [r["pid"] for r in await group.call(Echo.hello, 0)]
            raise RuntimeError("user bug")
    assert len(pids) == 2
    assert_reaped(pids)


async def test_cancelled_workflow_still_reaps_everything():
    """What Ctrl-C does under asyncio.run: the main task is cancelled."""
    pids: list[int] = []
    started = asyncio.Event()

    async def workflow():
        async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
            group = await ctl.spawn(Echo, num_ranks=2)
            pids.extend(r["pid"] for r in await group.call(Echo.hello, 0))
            started.set()
            await group.call(Echo.sleep, 60)

    task = asyncio.create_task(workflow())
    await started.wait()
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert_reaped(pids)


@pytest.mark.parametrize("launcher", LAUNCHERS)
async def test_cancelling_a_call_cancels_the_remote_task(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        pending = asyncio.ensure_future(group.call(Echo.sleep, 60))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while (await group.call(Echo.sleeps_begun))[0] == 0:  # the remote task is under way
            assert loop.time() < deadline, "the call never reached the worker"
            await asyncio.sleep(0.01)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        deadline = loop.time() + 60
        while (await group.call(Echo.get_events))[0] != ["cancelled"]:
            assert loop.time() < deadline, await group.call(Echo.get_events)
            await asyncio.sleep(0.01)


async def test_concurrent_calls_overlap():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        # each call returns only once all five are under way: run in series, they would hang
        meeting = asyncio.gather(*(group.call(Echo.meet, 5) for _ in range(5)))
        assert await asyncio.wait_for(meeting, 60) == [[5]] * 5


async def test_torchrun_environment_and_placement():
    config = RuntimeConfig(launcher="local", cluster=dynarl.ClusterConfig(devices_per_node=4))
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, devices=[2, 3])
        assert await group.call(Echo.env, "RANK") == ["0", "1"]
        assert await group.call(Echo.env, "WORLD_SIZE") == ["2", "2"]
        assert await group.call(Echo.env, "LOCAL_RANK") == ["0", "1"]
        assert await group.call(Echo.env, "LOCAL_WORLD_SIZE") == ["2", "2"]
        assert await group.call(Echo.env, "DYNARL_DEVICES") == ["2", "3"]
        ports = await group.call(Echo.env, "MASTER_PORT")
        assert ports[0] == ports[1] and int(ports[0]) > 0
        assert await group.call(Echo.env, "MASTER_ADDR") == ["127.0.0.1"] * 2


async def test_locally_defined_worker_class_is_rejected_clearly():
    class Local(dynarl.Worker):
        pass

    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        with pytest.raises(TypeError, match="module level"):
            await ctl.spawn(Local, num_ranks=1)
        assert ctl.pool.load() == {0: 0, 1: 0}  # the failed spawn released its devices


async def test_trace_written(tmp_path):
    import json
    path = tmp_path / "trace.json"
    async with dynarl.Controller(RuntimeConfig(launcher="inproc", trace_path=str(path))) as ctl:
        group = await ctl.spawn(Echo, num_ranks=2)
        await group.call(Echo.hello, 1)
        async with group.device_lock():
            pass
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["name"] for e in events}
    assert {"hello", "spawn", "lock_wait", "onload", "offload", "stopped"} <= names


def test_a_folder_named_dynarl_in_the_working_directory_does_not_shadow_the_package(tmp_path, monkeypatch):
    """A run directory called dynarl beside the job: the workers' import path leaves that
    folder's parent out (it would import as a namespace package ahead of an editable
    install), and keeps the other entries."""
    from dynarl.launch.local import worker_environment
    (tmp_path / "dynarl").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])
    paths = worker_environment({})["PYTHONPATH"].split(os.pathsep)
    assert str(tmp_path) not in paths and sys.path[1] in paths


async def test_workers_start_beside_a_folder_named_dynarl(tmp_path, monkeypatch):
    """The same, end to end: a worker process started in that directory imports dynarl."""
    (tmp_path / "dynarl").mkdir()
    monkeypatch.chdir(tmp_path)
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        assert [r["x"] for r in await group.call(Echo.hello, 7)] == [7]
