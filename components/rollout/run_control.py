"""A step's run on a rollout rank (a Generation, or the agentic workflow's turn
serving) as RolloutWorker drives it: the Run protocol, and the state machine its
drive loop and the rank's migration calls share.

Phases: running; paused (at an engine-step boundary); exported (paused, its work
handed off: its drive loop ends once not held); handed_off (exported, then resumed:
nothing left, it ends); closed (its drive loop ended); finished (its counters are
in). Held, while open: a migration may still hand it work, or give its work back.
What a run hands back unfinished crosses processes as a registered wire record
(Unfinished)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dynarl.components.experience import PromptGroup
from dynarl.components.rollout.base import InflightRequest, RolloutEngine
from dynarl.transport.wire import register_struct

Phase = Literal["running", "paused", "exported", "handed_off", "closed", "finished"]
Transition = Literal["pause", "export", "adopt", "resume", "hold", "let_go", "close", "finish"]

OPEN: tuple[Phase, ...] = ("running", "paused", "exported", "handed_off")
PHASES: dict[Transition, dict[Phase, Phase]] = {
    "pause": {"running": "paused"},
    "export": {"paused": "exported"},
    # a kept rank; a released one given its work back; one a rolled-back move left empty, kept by the next move
    "adopt": {"running": "running", "exported": "paused", "handed_off": "running"},
    "resume": {"running": "running", "paused": "running", "exported": "handed_off"},  # running: a move that failed
    "hold": {"running": "running", "paused": "paused", "exported": "exported", "handed_off": "handed_off"},
    "let_go": {"running": "running", "paused": "paused", "exported": "exported", "handed_off": "handed_off"},
    "close": {p: "closed" for p in OPEN},
    "finish": {"closed": "finished"},
}
"""Transition -> {phase it may leave: phase it enters}."""


class IllegalTransition(RuntimeError):
    pass


@register_struct(59)
@dataclass(kw_only=True, slots=True)
class Unfinished:
    """A run's work not finished, with its tokens so far: what a Workload migration
    moves (a WorkItem's body) and a partial rollout's close hands back. A whole group
    (Generation: its finished samples kept in it) or one agentic turn (_TurnServe)."""
    id: str
    weight: float
    """Its expected remaining work (WorkItem.weight, in workload_load's unit)."""
    inflight: list[InflightRequest]
    group: PromptGroup | None = None
    version: int = -1
    """The weights that made its tokens (set at a partial rollout's close)."""
    kv: list[list[Any]] = field(default_factory=list)
    """rollout.move_kv: [tokens, KV or its RemoteRef] of each request whose KV was held."""
    node: int | None = None
    """The node it left (with its KV)."""

    def to_wire(self) -> list[Any]:
        return [self.id, self.weight, [r.to_wire() for r in self.inflight], self.group, self.version, self.kv,
                self.node]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "Unfinished":
        id_, weight, inflight, group, version, kv, node = w
        return cls(id=str(id_), weight=float(weight), inflight=[InflightRequest.from_wire(r) for r in inflight],
                   group=group, version=int(version), kv=list(kv), node=node)


@dataclass(frozen=True)
class RunState:
    phase: Phase = "running"
    held: bool = False


def next_state(state: RunState, transition: Transition) -> RunState:
    phase = PHASES[transition].get(state.phase)
    if phase is None:
        raise IllegalTransition(f"a {state.phase} run cannot {transition}")
    return RunState(phase, {"hold": True, "let_go": False}.get(transition, state.held))


class RunControl:
    """One run's state, and the events its drive loop waits on: `arrived` (work or a
    transition came), `at_boundary` (paused between engine steps: safe to export),
    `finished` (its counters are in)."""

    def __init__(self) -> None:
        self.state = RunState()
        self.arrived, self.at_boundary, self.finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @property
    def paused(self) -> bool:
        return self.state.phase in ("paused", "exported")

    @property
    def handed_off(self) -> bool:
        return self.state.phase in ("exported", "handed_off")

    @property
    def held(self) -> bool:
        return self.state.held

    @property
    def closed(self) -> bool:
        return self.state.phase not in OPEN

    def go(self, transition: Transition) -> None:
        self.state = next_state(self.state, transition)

    def check(self, transition: Transition) -> None:
        """Raises IllegalTransition now if `transition` may not be taken (it is taken later)."""
        next_state(self.state, transition)

    def let_go(self) -> None:
        self.go("let_go")
        self.arrived.set()

    def finish(self) -> None:
        self.go("finish")
        self.finished.set()

    async def pause(self, engine: RolloutEngine) -> None:
        """Returns once the drive loop sets `at_boundary`: the engine step in flight is over."""
        self.go("pause")
        await engine.pause()
        self.arrived.set()
        await self.at_boundary.wait()

    async def resume(self, engine: RolloutEngine) -> None:
        self.go("resume")
        self.at_boundary.clear()
        await engine.resume()
        self.arrived.set()

    async def wait(self, fetch: asyncio.Future | None = None) -> None:
        """Until `arrived` is set again, or (while it runs) `fetch` ends."""
        self.arrived.clear()
        if fetch is None:
            await self.arrived.wait()
            return
        waiter = asyncio.ensure_future(self.arrived.wait())
        await asyncio.wait([waiter] if fetch.done() else [fetch, waiter], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()


class Run(Protocol):
    """What RolloutWorker needs of its step's run; Generation and _TurnServe take its
    pause, resume and close (and _TurnServe its mean_step_s)."""

    engine: RolloutEngine
    control: RunControl
    fetch_task: asyncio.Future | None = None
    """The task that takes its work in (set by its worker as it starts)."""
    num_tokens: int
    """Output tokens made here this step (exported ones counted, imported ones not)."""
    num_finished: int
    finished_tokens: int

    def mean_step_s(self) -> float:
        """Mean seconds of its engine steps so far (0: none, or not counted)."""
        return 0.0

    async def export(self) -> list[Unfinished]:
        """Its unfinished work, once paused, as a migration's items."""

    def adopt(self, items: list[Unfinished]) -> None:
        """Takes exported items over (or back)."""

    async def pause(self) -> None:
        await self.control.pause(self.engine)

    async def resume(self) -> None:
        await self.control.resume(self.engine)

    async def close(self) -> list[Unfinished]:
        """Partial rollout: the step has its batch. The run stops at an engine-step
        boundary and hands back what it has not finished (export's items); its drive
        loop then emits what finished and ends. A run a rolled-back move left empty
        (handed_off) has nothing to hand back: let go, its loop ends."""
        if self.control.state.phase == "handed_off":
            self.control.let_go()
            return []
        await self.pause()
        return await self.export()
