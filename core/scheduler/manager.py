"""One manager per WorkerGroup: writes its workers' metrics into the runtime
hypergraph (core/hypergraph.py: the component's node gets its current workers,
devices, each worker's utilization and requests held, and whether it is
interruptible), reads the scheduler's view of the component back from that node,
and guards its interruptible points.

Workers report `metrics()`: {"utilization": active KV / capacity (rollout) or
busy fraction, "running": int, "waiting": int, "work_done": cumulative work
units, "remaining_work": units left this iteration}; a rollout rank also its raw
"kv_utilization" and whether it is still "admitting" prompts (never a donor then).
The manager keeps, per engine, since when it has been low (policy.track_low, the
donor signal: below u_low and no longer admitting prompts),
and feeds measured throughput to the predictor's online correction. It also
keeps what the component's moves cost: the seconds of its migrations in the
current scheduling cycle (a step: out, then back), and, as `move_cost_s`, those
of the last cycle in which it moved, which the policy charges to the next move.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Literal

from dynarl.core.hypergraph import Hypergraph
from dynarl.core.scheduler.policy import ComponentView, track_low
from dynarl.core.scheduler.predictor import Predictor
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.migration.standby import StandbyPool


class InterruptGate:
    """A component is interruptible when no `busy()` section is open. `interrupt()`
    waits for quiescence and holds new busy sections back until the move is done
    (a writer-preferring readers-writer lock)."""

    def __init__(self) -> None:
        self._busy = 0
        self._moving = False
        self._changed = asyncio.Condition()

    @property
    def interruptible(self) -> bool:
        return self._busy == 0 and not self._moving

    @asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._moving)
            self._busy += 1
        try:
            yield
        finally:
            async with self._changed:
                self._busy -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def interrupt(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._moving)
            self._moving = True
            await self._changed.wait_for(lambda: self._busy == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._moving = False
                self._changed.notify_all()


@dataclass(slots=True)
class ComponentSpec:
    name: str
    kind: Literal["dynamic", "static"]
    strategy: Literal["workload", "p2p", "reboot"]
    devices_per_engine: int = 1
    min_devices: int = 1
    init: dict | None = None
    """Constructor arguments for ranks the component gains (grow, P2P, reboot)."""
    requests_per_engine: int = 1
    """Dynamic components: requests one engine batches (the tail consolidates onto
    ceil(running / this) engines)."""
    barrier: bool = False
    """Works only after the other components finish theirs (policy.ComponentView.barrier)."""
    standby: "StandbyPool | None" = None
    """Warm ranks: a P2P receiver adopts them, a Workload donor parks its released ones."""


class Manager:
    def __init__(self, spec: ComponentSpec, group: WorkerGroup, u_low: float,
                 graph: Hypergraph | None = None) -> None:
        self.spec = spec
        self.group = group
        self.u_low = u_low
        self.graph = graph if graph is not None else Hypergraph()
        """The component's node, under its name (P2P and reboot moves replace the group)."""
        self.gate = InterruptGate()
        self.low_since: dict[str, float | None] = {}
        self.peak: dict[str, float] = {}
        """Per engine: its highest utilization this cycle (track_low's fill)."""
        self.requests: dict[str, int] = {}
        """Per rank: requests running or waiting at the last poll."""
        self.remaining_work = 0.0
        self._last_done: tuple[float, float] | None = None
        self.measured_rate: float | None = None
        self.cycle_moves: list[float] = []
        """Seconds of each of this component's migrations in the current cycle."""
        self.move_cost_s = 0.0
        """Total of the last cycle that had migrations (0 until one has)."""

    @property
    def active_requests(self) -> int:
        """Requests running or waiting over the ranks, at the last poll."""
        return sum(self.requests.values())

    def begin_cycle(self) -> None:
        """A new scheduling cycle (step): the last one's moves become the known cost,
        and the idle time of the previous step is not this step's tail."""
        if self.cycle_moves:
            self.move_cost_s = sum(self.cycle_moves)
        self.cycle_moves = []
        self.low_since.clear()
        self.peak.clear()

    async def poll(self, now: float, predictor: Predictor | None = None) -> None:
        """Reads every worker's metrics. Consumes: one `metrics` call per rank."""
        reports = await self.group.call("metrics")
        workers = self.observe_group()
        # the engines' own KV utilization (the peak is the fill's, not the admitting mask's)
        self.graph.observe_load(self.spec.name, workers, [r.get("kv_utilization", r["utilization"]) for r in reports],
                                [int(r.get("running", 0) + r.get("waiting", 0)) for r in reports])
        self.graph.observe_interruptible(self.spec.name, self.gate.interruptible)
        node = self.graph.nodes[self.spec.name]
        node.kind = self.spec.kind
        utilization, queued = node.loads()
        self.requests = dict(zip(node.workers, queued))
        self.low_since, self.peak = track_low(node.workers, utilization, now, self.low_since, self.peak, self.u_low,
                                              [bool(r.get("admitting", False)) for r in reports])
        self.remaining_work = float(sum(r.get("remaining_work", 0.0) for r in reports))
        done = float(sum(r.get("work_done", 0.0) for r in reports))
        if self._last_done is not None and now > self._last_done[0] and done >= self._last_done[1]:
            self.measured_rate = (done - self._last_done[1]) / (now - self._last_done[0])
            if predictor is not None and self.spec.name in predictor.models and self.measured_rate > 0:
                predictor.models[self.spec.name].observe(len(self.group.devices), self.measured_rate)
        self._last_done = (now, done)

    def observe_group(self) -> list[str]:
        """The component's node gets its group's current workers and devices (after a
        poll and after each move); returns the workers."""
        workers = [h.spec.worker_id for h in self.group.handles]
        self.graph.observe_spawn(self.spec.name, self.group.cls.__name__, workers, self.group.devices)
        return workers

    def view(self) -> ComponentView:
        """The component as the scheduler sees it: its hypergraph node as of the last
        poll (workers, devices, requests held), its gate, its work and move costs."""
        if self.spec.name not in self.graph.nodes:
            self.observe_group()
        node = self.graph.nodes[self.spec.name]
        return ComponentView(
            name=self.spec.name, kind=self.spec.kind, devices=len(node.devices),
            remaining_work=self.remaining_work, devices_per_engine=self.spec.devices_per_engine,
            min_devices=self.spec.min_devices, interruptible=self.gate.interruptible,
            active_requests=self.active_requests if self.spec.kind == "dynamic" else None,
            requests_per_engine=self.spec.requests_per_engine, move_cost_s=self.move_cost_s,
            barrier=self.spec.barrier,
            engine_low_since=tuple(self.low_since.get(w) for w in node.workers))
