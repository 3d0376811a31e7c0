"""A fixed set of daemon threads that run a reward worker's sync reward calls.

Not concurrent.futures' ThreadPoolExecutor: its threads are joined when the process
exits, so one call that never returns would keep the worker from ever ending. A call
here that never returns holds its thread (later calls wait for the others), never the
process's exit.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable


class DaemonPool:
    def __init__(self, size: int, name: str = "reward") -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True) for i in range(size)]
        for thread in self._threads:
            thread.start()

    def run(self, fn: Callable[[], Any]) -> asyncio.Future:
        """`fn()` in a pool thread; its result (or exception) on the returned future of
        the running loop. Cancelling the future abandons the call, if it has begun."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._queue.put((loop, future, fn))
        return future

    def close(self) -> None:
        """The threads end once their calls have (none is waited for)."""
        for _ in self._threads:
            self._queue.put(None)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            loop, future, fn = item
            if future.cancelled():  # given up before it began
                continue
            try:
                outcome = (True, fn())
            except BaseException as exc:  # handed to the caller, whatever it is
                outcome = (False, exc)
            try:
                loop.call_soon_threadsafe(_settle, future, *outcome)
            except RuntimeError:  # the loop is closed: nobody waits
                pass


def _settle(future: asyncio.Future, ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)
