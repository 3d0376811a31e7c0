"""One manager per WorkerGroup: writes its workers' metrics into the runtime
hypergraph (core/hypergraph.py: the component's node gets its current workers,
devices, each worker's utilization and requests held, and whether it is
interruptible) and keeps what the scheduler's view of the component is read from
(loop.py, view.py); it also guards the component's interruptible points.

Workers report `metrics()`: a RankReport (report.py).

Per rollout engine the manager keeps since when it has been low (policy.track_low,
the donor signal) and its peak fill this cycle, and what it had finished (a
released engine keeps its count). It also keeps what the component's moves cost:
the seconds of its migrations in the current scheduling cycle (a step: out, then
back), and, as `move_cost_s`, those of the last cycle in which it moved, which
the policy charges to the next move.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Literal

from dynarl.core.hypergraph import Hypergraph
from dynarl.core.roles import ReportingRank
from dynarl.core.scheduler.policy import track_low
from dynarl.core.scheduler.report import RankReport
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
    strategy: Literal["workload", "join", "p2p"] | None = None
    """How it takes devices: join (its running stage takes new ranks: inference, a
    streaming trainer), p2p (a sharded trainer reshards onto them); None: it never
    receives. The dynamic component gives devices by Workload migration."""
    devices_per_engine: int = 1
    """Devices one rank runs on (a rollout engine's TP)."""
    unit: int = 0
    """It gains and gives devices in multiples of this (0: devices_per_engine): a
    megatron trainer's tensor-parallel size, one data-parallel replica."""
    min_devices: int = 1
    init: dict | None = None
    """Constructor arguments for ranks the component gains."""
    barrier: bool = False
    """Works only after the other components finish theirs (policy.ComponentView.barrier)."""
    stateful: bool = False
    """Its ranks hold sharded state (the trainer): a joining rank receives it peer-to-peer."""
    standby: "StandbyPool | None" = None
    """Warm ranks: a receiver adopts them, a Workload donor parks its released ones."""
    inbox: str | None = None
    """The channel its stage reads (the dynamic component's prompts: drained = its tail)."""


class Manager:
    def __init__(self, spec: ComponentSpec, group: WorkerGroup, u_low: float,
                 graph: Hypergraph | None = None) -> None:
        self.spec = spec
        self.group = group
        self.u_low = u_low
        self.graph = graph if graph is not None else Hypergraph()
        """The component's node, under its name (P2P moves replace the group)."""
        self.gate = InterruptGate()
        self.reports: list[RankReport] = []
        """The ranks' last metrics, in rank order."""
        self.reported: list[str] = []
        """The workers those reports are of."""
        self.low_since: dict[str, float | None] = {}
        self.peak: dict[str, float] = {}
        """Per engine: its highest utilization this cycle (track_low's fill)."""
        self.held_peak: dict[str, int] = {}
        """Per engine: the most requests it held at once this cycle."""
        self.finished: dict[str, tuple[int, int]] = {}
        """Per engine: requests finished this cycle and their output tokens, as of its last report."""
        self.packable: float | None = None
        """dynarl-consolidate's signal: since when the active KV packs onto few engines."""
        self.cycle_moves: list[float] = []
        """Seconds of each of this component's migrations in the current cycle."""
        self.move_cost_s = 0.0
        """Total of the last cycle that had migrations (0 until one has)."""

    def begin_cycle(self) -> None:
        """A new scheduling cycle (step): the last one's moves become the known cost,
        and the previous step's tail is not this step's."""
        if self.cycle_moves:
            self.move_cost_s = sum(self.cycle_moves)
        self.cycle_moves = []
        self.low_since.clear()
        self.peak.clear()
        self.held_peak.clear()
        self.finished.clear()
        self.packable = None
        self.reports, self.reported = [], []

    async def poll(self, now: float) -> None:
        """Reads every worker's metrics. Consumes: one `metrics` call per rank."""
        workers = [h.spec.worker_id for h in self.group.handles]  # the ranks asked (a move may follow)
        self.observe(now, workers, await self.group.call(ReportingRank.metrics))

    def observe(self, now: float, workers: list[str], reports: list[RankReport]) -> None:
        """One poll's reports of `workers` into the hypergraph and the cycle's state."""
        self.reports, self.reported = reports, workers
        self.observe_group()
        self.graph.nodes[self.spec.name].kind = self.spec.kind
        utilization = [r.utilization for r in reports]
        held = [r.running + r.waiting for r in reports]
        self.graph.observe_load(self.spec.name, workers, utilization, held)
        if self.spec.kind == "dynamic":
            self.low_since, self.peak, self.held_peak = track_low(
                workers, utilization, now, self.low_since, self.peak, self.u_low,
                [r.admitting for r in reports], held, self.held_peak)
            self.note(workers, reports)
        self.graph.observe_interruptible(self.spec.name, self.gate.interruptible)

    def note(self, workers: list[str], reports: list[RankReport]) -> None:
        """What these engines have finished this cycle (also read just before they are released).
        Only ever more within a cycle: an engine whose generation has ended reports none
        (its run's counters go with the run), which must not unsay what it finished."""
        for worker, r in zip(workers, reports):
            done, tokens = self.finished.get(worker, (0, 0))
            self.finished[worker] = (max(done, r.finished), max(tokens, r.finished_tokens))

    def processed(self) -> tuple[float, int]:
        """A stage's tokens and samples processed this step, over its ranks' last reports."""
        return float(sum(r.tokens for r in self.reports)), sum(r.samples for r in self.reports)

    async def current_reports(self) -> list[RankReport]:
        """The ranks' metrics: the last poll's while the ranks are those it asked (a
        decision acts on what it saw, without a second round trip to busy engines),
        else asked again."""
        if self.reported != [h.spec.worker_id for h in self.group.handles]:
            return await self.group.call(ReportingRank.metrics)
        return self.reports

    def observe_group(self) -> list[str]:
        """The component's node gets its group's current workers and devices (after a
        poll and after each move); returns the workers."""
        workers = [h.spec.worker_id for h in self.group.handles]
        self.graph.observe_spawn(self.spec.name, self.group.cls.__name__, workers, self.group.devices)
        return workers

    def low(self) -> tuple[float | None, ...]:
        """Per current engine: since when it has been low (None: not low)."""
        return tuple(self.low_since.get(w) for w in self.graph.nodes[self.spec.name].workers)
