"""ToolWorker: the tool component as a runtime worker.

    tools = await ctl.spawn(ToolWorker, num_ranks=1, init={"config": {"max_concurrency": 16}})
    [result] = await tools.call(ToolWorker.python, "print(1 + 1)", 5.0)   # ToolResult(ok=True, stdout="2\\n", ...)

setup() proves the sandbox works, so a node without a usable bubblewrap fails at
spawn with the reason instead of at the first agent turn; with `python=False` (a job
whose episodes call only the calculator) no sandbox is needed and python() answers
with an error. Python calls run
concurrently up to `max_concurrency` (the sandbox's semaphore); calculator calls
are cheap and run at once. Every call's latency goes to `latency_stats()`.
"""
from __future__ import annotations

import time
from typing import Any

import dynarl
from dynarl.components.tools.calculator import calculate
from dynarl.components.tools.config import ToolConfig
from dynarl.components.tools.latency import LatencyLog
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.tools.python_sandbox import PythonSandbox
from dynarl.core.config_tree import build

TOOL_OFF = "tool {} is off"
"""The error a call to a tool the job left out reads (short: the model reads it)."""


class ToolWorker(dynarl.Worker):
    def __init__(self, config: dict | None = None, python: bool = True) -> None:
        self.config = build(ToolConfig, config, "tool")
        self.latency = LatencyLog()
        self.sandbox = PythonSandbox(self.config, latency=self.latency)
        self.python_on = python

    async def setup(self) -> None:
        if self.python_on:
            await self.sandbox.check()

    async def teardown(self) -> None:
        self.sandbox.close()

    async def python(self, code: Any, timeout_s: float | None = None) -> ToolResult:
        """Runs model-generated code."""
        if not self.python_on:
            result = ToolResult(ok=False, stdout="", error=TOOL_OFF.format("py"), rejected=True)
            self.latency.record("python", 0.0, ok=False, rejected=True)
            return result
        return await self.sandbox.run(code, timeout_s)

    async def calculator(self, expression: Any) -> ToolResult:
        started = time.perf_counter()
        result = calculate(expression)
        result.latency_s = time.perf_counter() - started
        self.latency.record("calculator", result.latency_s, ok=result.ok, rejected=result.rejected)
        return result

    def latency_stats(self) -> dict[str, dict[str, float | int]]:
        return self.latency.stats()

    def started_pids(self) -> list[int]:
        """Host pids of recent sandbox processes (for checks that each was reaped)."""
        return list(self.sandbox.started_pids)
