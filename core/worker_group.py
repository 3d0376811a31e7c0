"""WorkerGroup: the controller's handle on the ranks of one component.

    results = await group.call(RolloutWorker.generate, prompts)      # every rank, rank order
    first = await group.on([0]).call(TrainerWorker.state)             # chosen ranks
    per_rank = await group.scatter(TrainerWorker.train, [[b0], [b1]])  # one argument list per rank
    async with group.device_lock(): ...                               # time-share devices

A remote call names its method by reference (the worker class's, or the role
Protocol's that core/ calls: core/roles.py), so an editor, mypy and a rename follow
it; what crosses the wire is the method's name (remote.py).
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Sequence, overload

from dynarl.core.remote import AsyncMethod, P, R, SyncMethod, method_name
from dynarl.core.worker import Worker
from dynarl.core.worker_handle import WorkerHandle

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from dynarl.core.controller import Controller


class WorkerGroup:
    def __init__(self, ctl: "Controller", name: str, cls: type, handles: list[WorkerHandle], threads: int = 1) -> None:
        self._ctl = ctl
        self.name = name
        self.cls = cls
        self.handles = handles
        self.threads = threads
        """Each rank's torch threads, its later ranks' too (a standby or a reshard of it takes the same)."""
        self.stopped = False

    @property
    def world_size(self) -> int:
        return len(self.handles)

    @property
    def devices(self) -> list[int]:
        return [d for h in self.handles for d in h.spec.devices]

    @property
    def pids(self) -> list[int | None]:
        return [h.pid for h in self.handles]

    @overload
    async def call(self, method: AsyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> list[R]: ...

    @overload
    async def call(self, method: SyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> list[R]: ...

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """Calls `method` with the same arguments on every rank; results in rank
        order. If one rank fails, the others' calls are cancelled and that first
        error is raised."""
        return await self.on(None).call(method, *args, **kwargs)

    async def scatter(self, method: Callable[..., Any], per_rank_args: Sequence[Sequence[Any]]) -> list[Any]:
        """Calls `method` on each rank with its own positional arguments."""
        return await self.on(None).scatter(method, per_rank_args)

    def on(self, ranks: Sequence[int] | None) -> "Ranks":
        """The group's ranks at these positions (None: all), to call."""
        return Ranks(self, list(range(self.world_size) if ranks is None else ranks))

    @asynccontextmanager
    async def device_lock(self) -> AsyncIterator[None]:
        """Holds this group's devices: its ranks onload on entry and offload on exit.
        Only the ranks that took the lock and are still in the group offload: a rank
        grown while it is held runs on other devices, outside this lock; a rank that
        left meanwhile (stopped, or parked in a standby pool) is not offloaded here."""
        loop = asyncio.get_running_loop()
        asked = loop.time()
        async with self._ctl.locks.hold(self.name, self.devices):
            got = loop.time()
            self._ctl.tracer.complete("lock_wait", "device_lock", self.name, 0, asked, got)
            holders = list(self.handles)
            await self._on_live(Worker.onload)
            try:
                yield
            except BaseException as failure:  # the work failed: its error is raised, not the offload's after it
                try:
                    await self._on_live(Worker.offload, set(map(id, holders)))
                except Exception as exc:  # (a stopped step's engines still hold requests: expected, not news)
                    say = log.debug if isinstance(failure, asyncio.CancelledError) else log.warning
                    say("%s: offload after a failure failed too: %s", self.name, str(exc).splitlines()[0])
                raise
            else:
                await self._on_live(Worker.offload, set(map(id, holders)))
            finally:
                self._ctl.tracer.complete("device_held", "device_lock", self.name, 0, got, loop.time())

    async def _on_live(self, method: AsyncMethod[[], None], among: set[int] | None = None) -> None:
        """`method` on the ranks not lost (of those in `among`, by id): a lost rank has no
        memory to move, and the work it misses fails where the work is asked of it
        (or is survived there: components/workflows/survival.py). A rank lost during the
        call is skipped too; any other failure is raised."""
        chosen = [h for h in self.handles if h.lost is None and (among is None or id(h) in among)]
        results = await asyncio.gather(*(h.call(method) for h in chosen), return_exceptions=True)
        for h, result in zip(chosen, results):
            if isinstance(result, BaseException) and h.lost is None:
                raise result

    async def stop(self) -> None:
        await self._ctl.stop_group(self)

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, {self.cls.__name__}, ranks={self.world_size})"


class Ranks:
    """Some of a group's ranks, by position: `group.on([0]).call(...)`."""

    def __init__(self, group: WorkerGroup, positions: list[int]) -> None:
        self.group = group
        self.positions = positions

    @overload
    async def call(self, method: AsyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> list[R]: ...

    @overload
    async def call(self, method: SyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> list[R]: ...

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        name = method_name(method, self.group.cls)
        return await gather_or_cancel([self.group.handles[r].send(name, args, kwargs) for r in self.positions])

    async def scatter(self, method: Callable[..., Any], per_rank_args: Sequence[Sequence[Any]]) -> list[Any]:
        if len(per_rank_args) != len(self.positions):
            raise ValueError(f"{len(per_rank_args)} argument lists for {len(self.positions)} ranks")
        name = method_name(method, self.group.cls)
        return await gather_or_cancel([self.group.handles[r].send(name, list(a), {})
                                       for r, a in zip(self.positions, per_rank_args)])


async def gather_or_cancel(calls: Sequence[Awaitable[Any]]) -> list[Any]:
    if len(calls) == 1:  # nothing to cancel beside it: awaited in place, no task
        return [await calls[0]]
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if pending:
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:  # the first failure in rank order
        error = t.exception() if t.done() and not t.cancelled() else None
        if error is not None:
            for other in tasks:  # retrieve the rest so asyncio does not warn
                if other is not t and other.done() and not other.cancelled():
                    other.exception()
            raise error
    return [t.result() for t in tasks]
