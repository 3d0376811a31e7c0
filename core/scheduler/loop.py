"""The global scheduler: thin async orchestration around the pure policy.

Every `interval_s` it polls each component's manager, builds the ClusterView, times
the policy's decision, and carries out a committed plan: donors release whole
engines by Workload migration (idle engines first), and receivers take the
freed devices by their own strategy: Workload (grow the group), P2P (a new
trainer on old + freed devices, create-before-destroy) or Reboot. Each move
waits for the component's interruptible point (its InterruptGate). A component
with a StandbyPool parks released ranks there and adopts new ranks from it
(no process spawn on the move's path). Every move's duration is recorded, and
charged to its component's manager as the cost the policy weighs next time; the
log also keeps each component's device count after every move (`counts`), which
`device_stats` turns into a window's mean, min and max.

The workflow reads components through `scheduler.group(name)`: a P2P or Reboot
move replaces a component's WorkerGroup.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dynarl.core.migration.p2p import p2p_migrate
from dynarl.core.migration.reboot import reboot_migrate
from dynarl.core.migration.workload import workload_migrate
from dynarl.core.scheduler.manager import ComponentSpec, Manager
from dynarl.core.scheduler.policy import DynarlConfig, Plan, ClusterView, decide_dynarl
from dynarl.core.scheduler.predictor import Predictor
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.controller import Controller


@dataclass(slots=True)
class Migration:
    kind: str
    component: str
    devices: list[int]
    started: float
    seconds: float


@dataclass(slots=True)
class DecisionRecord:
    at: float
    ms: float
    plan: Plan | None


@dataclass(slots=True)
class DeviceCounts:
    """Each component's device count from `at` until the next sample."""
    at: float
    counts: dict[str, int]


@dataclass(slots=True)
class SchedulerLog:
    decisions: list[DecisionRecord] = field(default_factory=list)
    migrations: list[Migration] = field(default_factory=list)
    counts: list[DeviceCounts] = field(default_factory=list)

    def decision_ms(self) -> list[float]:
        return sorted(d.ms for d in self.decisions)


def device_stats(samples: list[DeviceCounts], start: float, end: float) -> dict[str, dict[str, float]]:
    """Each component's device count over [start, end], from the step function
    `samples` (in time order; each holds until the next; the last one at or before
    `start` is the value the window opens with): the time-weighted mean, the min
    and the max. An empty window (end <= start) reports the count at `start`."""
    opening = [s for s in samples if s.at <= start][-1:]
    if not opening:
        raise ValueError(f"no device counts at or before {start}")
    held = opening + [s for s in samples if start < s.at < end]
    names = sorted({name for s in held for name in s.counts})
    stats: dict[str, dict[str, float]] = {}
    for name in names:
        values = [s.counts.get(name, 0) for s in held]
        if end <= start:
            mean = float(values[0])
        else:
            bounds = [start] + [s.at for s in held[1:]] + [end]
            mean = sum(v * (b - a) for v, a, b in zip(values, bounds, bounds[1:])) / (end - start)
        stats[name] = {"mean": mean, "min": float(min(values)), "max": float(max(values))}
    return stats


class GlobalScheduler:
    def __init__(self, ctl: "Controller", policy: Literal["static", "dynarl"], predictor: Predictor,
                 config: DynarlConfig | None = None, interval_s: float = 1.0) -> None:
        if policy not in ("static", "dynarl"):
            raise ValueError(f"unknown scheduler policy {policy!r}; choose static or dynarl")
        self.ctl = ctl
        self.policy = policy
        self.predictor = predictor
        self.config = config or DynarlConfig()
        self.interval_s = interval_s
        self.managers: dict[str, Manager] = {}
        self.log = SchedulerLog()

    def register(self, spec: ComponentSpec, group: WorkerGroup) -> Manager:
        manager = self.managers[spec.name] = Manager(spec, group, self.config.u_low, self.ctl.graph)
        self._count()
        return manager

    def group(self, name: str) -> WorkerGroup:
        return self.managers[name].group

    async def run(self) -> None:
        """Ticks until cancelled. Owned by the controller's TaskGroup (ctl.spawn_task)."""
        while True:
            await asyncio.sleep(self.interval_s)
            await self.tick()

    async def tick(self) -> Plan | None:
        now = asyncio.get_running_loop().time()
        for manager in self.managers.values():
            if manager.gate.interruptible:
                await manager.poll(now, self.predictor)
        view = ClusterView(now, tuple(m.view() for m in self.managers.values()))
        begun = time.perf_counter()
        plan = decide_dynarl(view, self.predictor, self.config) if self.policy == "dynarl" else None
        self.log.decisions.append(DecisionRecord(now, (time.perf_counter() - begun) * 1000, plan))
        if plan is not None:
            await self.execute(plan)
        return plan

    async def execute(self, plan: Plan) -> None:
        for donor, receiver, devices in plan.moves:
            freed = await self._release(self.managers[donor], devices)
            if freed:
                await self._receive(self.managers[receiver], freed)

    async def _release(self, manager: Manager, devices: int) -> list[int]:
        spec, group = manager.spec, manager.group
        ranks = devices // spec.devices_per_engine
        # Idle engines first, among them those with the least work (a finished one costs
        # nothing to release, and the kept ones must still be generating to take the
        # rest), then the longest idle; never all of them.
        def order_key(p: int) -> tuple:
            key = group.handles[p].spec.worker_id
            since = manager.low_since.get(key)
            return since is None, manager.requests.get(key, 0), since or 0.0, p
        order = sorted(range(group.world_size), key=order_key)
        release = order[:min(ranks, group.world_size - 1)]
        if not release:
            return []
        async with manager.gate.interrupt():
            begun = asyncio.get_running_loop().time()
            result = await workload_migrate(self.ctl, group, release, park=spec.standby)
            self.record("workload", spec.name, result.freed_devices, begun)
        return result.freed_devices

    async def _receive(self, manager: Manager, freed: list[int]) -> None:
        spec = manager.spec
        async with manager.gate.interrupt():
            begun = asyncio.get_running_loop().time()
            group = manager.group
            if spec.strategy == "workload":
                await self.ctl.grow_group(group, freed, spec.init)
            elif spec.strategy == "p2p":
                manager.group = (await p2p_migrate(self.ctl, group, group.devices + freed, spec.init or {},
                                                   standby=spec.standby)).group
            else:
                manager.group = (await reboot_migrate(self.ctl, group, group.devices + freed, spec.init or {})).group
            self.record(spec.strategy, spec.name, freed, begun)

    def record(self, kind: str, component: str, devices: list[int], begun: float) -> None:
        now = asyncio.get_running_loop().time()
        self.log.migrations.append(Migration(kind, component, list(devices), begun, now - begun))
        if component in self.managers:
            self.managers[component].cycle_moves.append(now - begun)
            self.managers[component].observe_group()  # the hypergraph shows the move at once
        self._count()

    def _count(self) -> None:
        self.log.counts.append(DeviceCounts(asyncio.get_running_loop().time(),
                                            {name: len(m.group.devices) for name, m in self.managers.items()}))
