"""`dynarl.run(workflow, config)`: run a workflow coroutine under a fresh controller.

Real launchers run on uvloop in real time. The inproc launcher can run in
virtual time (`virtual_time=True`): timers jump ahead when nothing is runnable,
which is sound only because every actor then lives in the loop.
"""
from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

from dynarl.core.config import RuntimeConfig
from dynarl.core.controller import Controller

Workflow = Callable[[Controller], Awaitable[Any]]


def run(workflow: Workflow, config: RuntimeConfig | None = None, *, virtual_time: bool = False) -> Any:
    config = config or RuntimeConfig()

    async def main() -> Any:
        cancel_on_sigterm()
        async with Controller(config) as ctl:
            return await workflow(ctl)

    if virtual_time:
        if config.launcher != "inproc":
            raise ValueError("virtual time needs launcher='inproc' (real processes and sockets run in real time)")
        from dynarl.core.virtual_time import run_virtual
        return run_virtual(main())
    import uvloop
    return uvloop.run(main())


def cancel_on_sigterm() -> None:
    """SIGTERM (slurm's notice before it kills a job, `kill`) cancels the workflow like
    Ctrl-C does, so the controller's ordered shutdown runs: workers tear down (channels
    flushed, payloads handed over) instead of dying of PDEATHSIG. It writes no
    checkpoint: `dynarl train` resumes from its last one (run.checkpoint_every)."""
    import signal
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the embedding program handles SIGTERM itself
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def once() -> None:
        # slurm signals every process of the job, and torchrun passes its own SIGTERM
        # on: a second one must not cancel the ordered stop the first one began
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        task.cancel()
    try:
        loop.add_signal_handler(signal.SIGTERM, once)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass


def dump_tasks_on_sigusr1() -> None:
    """`kill -USR1 PID` prints where each task of this loop waits (its chain of awaits),
    for a run that seems stuck; nothing else changes."""
    import signal
    import sys
    loop = asyncio.get_running_loop()

    def dump() -> None:
        for task in asyncio.all_tasks(loop):
            print(f"--- task {task.get_name()}: " + " <- ".join(reversed(await_chain(task.get_coro()))),
                  file=sys.stderr, flush=True)
    try:
        loop.add_signal_handler(signal.SIGUSR1, dump)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass


def await_chain(coro: Any) -> list[str]:
    """file:line function of each coroutine a suspended one awaits, outermost first."""
    out = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out
