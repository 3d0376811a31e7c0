NUM_GPUS = 0

import asyncio

import pytest

import dynarl
from conftest import assert_reaped
from dynarl import RuntimeConfig
from dynarl.components.tools import ToolWorker


@pytest.mark.parametrize("launcher", ["inproc", "local"])
async def test_tool_worker_serves_concurrent_calls(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        tools = await ctl.spawn(ToolWorker, num_ranks=1, init={"config": {"max_concurrency": 16, "timeout_s": 5}})
        answers = await asyncio.gather(*(tools.call(ToolWorker.python, f"print({i} + {i})") for i in range(16)))
        assert [a[0].stdout for a in answers] == [f"{2 * i}\n" for i in range(16)]
        assert all(a[0].ok and a[0].latency_s > 0 for a in answers)
        [blocked] = await tools.call(ToolWorker.python, "import socket\nsocket.create_connection(('1.1.1.1', 80))", 2.0)
        assert blocked.error == "forbidden: no network"
        [slow] = await tools.call(ToolWorker.python, "while True:\n    pass", 1.0)
        assert slow.error == "timeout after 1.0 s"
        [bad] = await tools.call(ToolWorker.python, 42)
        assert bad.error == "malformed request: code must be a string, got int" and bad.rejected
        assert not slow.rejected  # (it ran, and was stopped)
        [sum_] = await tools.call(ToolWorker.calculator, "(1 + 2) * 3 / 4")
        assert (sum_.ok, sum_.stdout) == (True, "2.25")
        [refused] = await tools.call(ToolWorker.calculator, "open('/etc/passwd')")
        assert refused.error == "not arithmetic: calling open() is not allowed"
        [stats] = await tools.call(ToolWorker.latency_stats)
        assert (stats["python"]["calls"], stats["python"]["errors"], stats["python"]["rejected"]) == (19, 2, 1)
        assert (stats["calculator"]["calls"], stats["calculator"]["errors"]) == (2, 1)
        assert stats["python"]["max_s"] >= 1.0
        [pids] = await tools.call(ToolWorker.started_pids)
    assert len(pids) >= 2 * 18  # probe + 18 runs: bwrap and the sandbox's pid 1 each
    assert_reaped(pids)


async def test_tool_worker_without_bwrap_fails_at_spawn():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        with pytest.raises(Exception, match="bubblewrap not found"):
            await ctl.spawn(ToolWorker, num_ranks=1, init={"config": {"bwrap": "/nonexistent/bwrap"}})


async def test_tool_worker_config_errors_name_the_field():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        with pytest.raises(Exception, match="tool.max_concurency"):
            await ctl.spawn(ToolWorker, num_ranks=1, init={"config": {"max_concurency": 4}})
        with pytest.raises(Exception, match="cpu_s"):
            await ctl.spawn(ToolWorker, num_ranks=1, init={"config": {"cpu_s": 0}})
