"""Running one stage of one step over a WorkerGroup, and timing it.

    rollout = stage(ctl, groups.rollout, RolloutWorker.generate, get="prompts", put="rollouts")
    reward  = stage(ctl, groups.reward, RewardWorker.score, get="rollouts", put="scored", after=rollout, lock=False)

Every rank runs `method(get, put, **kwargs)`: it reads chunks from channel `get`
until an END marker and writes results to `put`. When the upstream stage `after`
has returned (all its ranks flushed their puts), one END per rank of this group
goes into `get`, behind everything upstream produced (channels are FIFO). A rank
reads its input with prefetch 1, so it never takes a second rank's END.

With `lock`, the stage runs inside the group's device_lock. Locks are FIFO and
stages ask for them in the order they are started, which is the order of the data
dependencies; so on shared devices (colocated) rollout runs first, then inference
and trainer follow as the devices free up, while on disjoint devices (spatial) a
downstream stage holds its own devices and starts on the first finished chunk.
"""
from __future__ import annotations

import asyncio
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from dynarl.components.experience import END

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_group import WorkerGroup


@dataclass(slots=True)
class Span:
    component: str
    devices: list[int]
    start: float
    end: float
    label: str
    """What ran ("step 3", "warmup", "checkpoint")."""


@dataclass(slots=True)
class StageClock:
    """Spans of device use, for per-stage times, the timeline and the trace."""
    spans: list[Span] = field(default_factory=list)
    on_stage: Callable[[str], None] | None = None
    """Told the component name whenever a stage starts (the progress display)."""

    def last_end(self, component: str) -> float:
        return max(s.end for s in self.spans if s.component == component)

    def durations(self, label: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for s in self.spans:
            if s.label == label:
                out[s.component] = out.get(s.component, 0.0) + s.end - s.start
        return out


async def stage(ctl: "Controller", group: "WorkerGroup", method: Callable[..., Any], *, get: str | None = None,
                put: str | None = None, after: asyncio.Future | None = None, lock: bool = True,
                gate: asyncio.Future | None = None, clock: StageClock, label: str,
                ranks_call: Callable[..., Awaitable[list[Any]]] | None = None, **kwargs: Any) -> list[Any]:
    """Runs `method(get, put, **kwargs)` (a worker method, by reference) on every rank;
    returns the per-rank results.
    `gate`: the ranks are called once it is done (their devices held meanwhile);
    `ranks_call`: calls the ranks instead of group.call (the rollout's: survival.py)."""
    async def call() -> list[Any]:
        if gate is not None:
            await gate
        return await (ranks_call or group.call)(method, get, put, **kwargs)
    work = asyncio.ensure_future(held(ctl, group, clock, label, method.__name__, call, lock=lock))
    if after is None:
        return await work
    closer = asyncio.ensure_future(_end_after(after, ctl, get, group.world_size))
    try:
        await asyncio.wait([work, closer], return_when=asyncio.FIRST_EXCEPTION)
        if closer.done() and closer.exception() is not None:
            raise closer.exception()  # upstream failed: no END will come
        return await work
    finally:
        for task in (work, closer):
            task.cancel()
            task.add_done_callback(_retrieved)  # (now or when it ends): the one that matters was raised above


async def held(ctl: "Controller", group: "WorkerGroup", clock: StageClock, label: str, name: str,
               call: Callable[[], Awaitable[Any]], *, lock: bool = True, component: str | None = None) -> Any:
    """Awaits `call()` inside the group's device_lock (unless lock=False), as a span
    of `component` (default: the group's name)."""
    component = component or group.name
    async with group.device_lock() if lock else nullcontext():
        start = _now()
        if clock.on_stage is not None:
            clock.on_stage(component)
        try:
            return await call()
        finally:
            end = _now()
            clock.spans.append(Span(component, group.devices if lock else [], start, end, label))
            ctl.tracer.complete(f"{name} {label}", "stage", f"stage/{component}", 0, start, end)


def _retrieved(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()


async def _end_after(upstream: asyncio.Future, ctl: "Controller", get: str, consumers: int) -> None:
    await upstream
    channel = ctl.channel(get)
    for _ in range(consumers):
        await channel.put(END)


def _now() -> float:
    return asyncio.get_running_loop().time()
