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
    """Runs `await workflow(ctl)` under a fresh Controller (started, then shut down in
    order) on uvloop, and returns its result.

        async def workflow(ctl: dynarl.Controller) -> list[int]:
            group = await ctl.spawn(MyWorker, num_ranks=2)
            return await group.call(MyWorker.method, 1)

        if __name__ == "__main__":   # workers import this script: see below
            print(dynarl.run(workflow, dynarl.RuntimeConfig(launcher="local")))

    `config`: the runtime (launcher, cluster shape, liveness bounds; RuntimeConfig()
    by default). `virtual_time`: with launcher "inproc" only, timers jump ahead when
    nothing is runnable (simulation). Worker classes defined in the script itself are
    found by worker processes importing the script, so the call that starts the job
    must sit under `if __name__ == "__main__":`; without it a worker's import raises
    MainGuardMissing (core/script_guard.py) naming the script.

    SIGINT raises KeyboardInterrupt and SIGTERM CancelledError here, each once the
    workers were stopped in order (OrderedStop: later signals do not cut that short)."""
    from dynarl.core.script_guard import refuse_in_import
    refuse_in_import("dynarl.run()")
    config = config or RuntimeConfig()
    stop = OrderedStop("dynarl", bound_s=config.shutdown_grace_s + 1.0)  # (+ a reap's SIGTERM wait)

    async def main() -> Any:
        stop.attach()
        async with Controller(config) as ctl:
            return await workflow(ctl)

    if virtual_time and config.launcher != "inproc":
        raise ValueError("virtual time needs launcher='inproc' (real processes and sockets run in real time)")
    import signal

    import uvloop

    from dynarl.core.virtual_time import run_virtual
    try:
        with stop:
            return run_virtual(main()) if virtual_time else uvloop.run(main())
    except asyncio.CancelledError:
        if stop.received == signal.SIGINT:
            raise KeyboardInterrupt from None
        raise


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
    assert task is not None, "cancel_on_sigterm() runs in the main task"

    def once() -> None:
        # slurm signals every process of the job, and torchrun passes its own SIGTERM
        # on: a second one must not cancel the ordered stop the first one began
        loop.add_signal_handler(signal.SIGTERM, lambda: None)
        task.cancel()
    try:
        loop.add_signal_handler(signal.SIGTERM, once)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        pass


class OrderedStop:
    """SIGINT and SIGTERM for a job whose controller stops its workers in order. The
    first one cancels the job's main task (the controller's exit then runs the ordered
    stop); each later one only prints that the stop is under way and about how long it
    has left: the stop runs to its end however many come (a second Ctrl-C included,
    which asyncio's own handler would raise as KeyboardInterrupt inside the stop).
    `kill -9` still ends the process at once; its temp dirs go at the next start.

        with OrderedStop("dynarl train", bound_s=...) as stop:
            uvloop.run(main())   # main() calls stop.attach() first
        stop.received            # the first signal, or None

    Signals that already have a handler other than the default (an embedding
    program's) are left to it, as are all of them off the main thread."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self, name: str, bound_s: float) -> None:
        self.name, self.bound_s = name, bound_s
        self.received: int | None = None
        self._since = 0.0
        self._task: asyncio.Task | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "OrderedStop":
        import signal
        import threading
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in (getattr(signal, n) for n in self.SIGNALS):
            if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
                self._previous[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # (also over what the closed loop left installed)
        self._previous.clear()

    def attach(self) -> None:
        """From the main task, in its loop: that task is what the first signal cancels
        (at once if one came before). Its signals now wake the loop at once."""
        loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        for sig in self._previous:
            try:
                loop.add_signal_handler(sig, self._on_signal, sig, None)
            except (NotImplementedError, RuntimeError, ValueError):  # this loop has none: the handler still runs
                pass
        if self.received is not None and self._task is not None:
            self._task.cancel()

    def _on_signal(self, signum: int, frame: Any) -> None:
        import os
        import signal
        import time
        if self._task is not None and self._task.done():
            return  # the job has ended: nothing left to stop
        if self.received is None:
            self.received, self._since = signum, time.monotonic()
            what = "stopping the workers in order"
            if self._task is not None:
                self._task.get_loop().call_soon_threadsafe(self._task.cancel)
        else:
            left = max(0.0, self.bound_s - (time.monotonic() - self._since))
            what = (f"already stopping the workers in order, about {left:.0f} s left (kill -9 {os.getpid()} "
                    "ends it now; its temp dirs then go at the next start)")
        # os.write: this may run between any two bytecodes, print could re-enter stderr's buffer
        os.write(2, f"{self.name}: {signal.Signals(signum).name}: {what}\n".encode())


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
