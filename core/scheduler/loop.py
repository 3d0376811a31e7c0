"""The global scheduler: thin async orchestration around the pure policy, the same
in `dynarl train` and `dynarl sim`.

During a step it ticks: every `interval_s` (every `tail_interval_s` once the
dynamic component's input is drained and its tail has begun) it polls each
component's manager (their workers' metrics go into the runtime hypergraph),
reads the ClusterView back (view.py: remaining work, the donor's floor and
signal, the devices each component holds), asks the policy for a plan against
the predictor (a RateSource: profiled on the job's engines, or the cost model's
for emulated ones), times the decision, and has the Mover (core/migration/
mover.py) carry the plan out while the step goes on.

The log keeps every decision, every move (kind, component, devices, start,
seconds) and each component's device count after every change of ownership
(`counts`), which `device_stats` turns into a window's mean, min and max.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.scheduler.log import DecisionRecord, SchedulerLog
from dynarl.core.scheduler.manager import ComponentSpec, Manager
from dynarl.core.scheduler.policy import ClusterView, ComponentView, DynarlConfig, Plan, decide_dynarl
from dynarl.core.scheduler.predictor import Predictor
from dynarl.core.scheduler.view import (RolloutProgress, StepWork, packable_since, rollout_demand, rollout_done,
                                        rollout_progress, rollout_tokens_left, stage_tokens_left)
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.migration.mover import Mover
    from dynarl.core.migration.step import Step


class RateSource(Protocol):
    """The predictor's throughput points (work units: tokens per second)."""

    def predictor(self, work: StepWork, rollout: RolloutProgress) -> Predictor: ...


@dataclass(slots=True)
class StepState:
    """The step in progress as the scheduler reads it."""
    live: "Step"
    work: StepWork


class GlobalScheduler:
    def __init__(self, ctl: "Controller", policy: Literal["static", "dynarl"], rates: RateSource,
                 config: DynarlConfig | None = None, *, interval_s: float = 1.0,
                 tail_interval_s: float | None = None, time_scale: float = 1.0) -> None:
        if policy not in ("static", "dynarl"):
            raise ValueError(f"unknown scheduler policy {policy!r}; choose static or dynarl")
        self.ctl = ctl
        self.policy = policy
        self.rates = rates
        self.config = config or DynarlConfig()
        self.interval_s = interval_s
        self.tail_interval_s = tail_interval_s or interval_s
        self.time_scale = time_scale
        """Real seconds per emulated second (the simulator on a real clock); 1 otherwise."""
        self.managers: dict[str, Manager] = {}
        self.log = SchedulerLog()
        self.mover: Mover | None = None
        """Carries plans out (set once the components are registered)."""
        self.running = False
        self._wake = asyncio.Event()

    def register(self, spec: ComponentSpec, group: WorkerGroup) -> Manager:
        manager = self.managers[spec.name] = Manager(spec, group, self.config.u_low, self.ctl.graph)
        return manager

    def group(self, name: str) -> WorkerGroup:
        return self.managers[name].group

    @property
    def donor(self) -> Manager:
        return next(m for m in self.managers.values() if m.spec.kind == "dynamic")

    def now(self) -> float:
        """Scheduler time: emulated seconds under a time scale."""
        return asyncio.get_running_loop().time() / self.time_scale

    def start(self) -> None:
        """The ticker may run (before its task starts, so a stop right after holds)."""
        self.running = True
        self._wake = asyncio.Event()

    def stop(self) -> None:
        """The ticker ends at once if it waits, or after the tick in progress (a move
        completes first)."""
        self.running = False
        self._wake.set()

    async def run(self, step: StepState) -> None:
        """Ticks until stopped (`start` first)."""
        prompts, waited = self.donor.spec.inbox, 0.0
        while self.running:
            period = self.interval_s
            if prompts is not None and len(self.ctl.channel(prompts)) == 0 and self.donor.reports and \
                    sum(r.running + r.waiting for r in self.donor.reports) > 0:
                period = self.tail_interval_s  # the tail has begun (as of the last poll)
            tick = min(period, self.tail_interval_s)
            try:
                await asyncio.wait_for(self._wake.wait(), tick * self.time_scale)
            except TimeoutError:
                pass
            waited += tick
            if not self.running:
                break
            if waited >= period - 1e-12:
                waited = 0.0
                await self.tick(step)

    async def tick(self, step: StepState) -> Plan | None:
        now = self.now()
        await gather_or_cancel([manager.poll(now) for manager in self.managers.values()
                                if manager.gate.interruptible])  # at once: a busy stage answers late
        view, progress = self.view(now, step)
        begun = time.perf_counter()
        plan = None
        if self.policy == "dynarl":
            plan = decide_dynarl(view, self.rates.predictor(step.work, progress), self.config)
        self.log.decisions.append(DecisionRecord(asyncio.get_running_loop().time(),
                                                 (time.perf_counter() - begun) * 1000, plan))
        if plan is not None and self.mover is not None:
            try:
                await self.mover.execute(plan, step.live)
            except MigrationFailed as exc:  # rolled back, or its devices wait for the step's end
                self.log.failures.append(str(exc))
        return plan

    def view(self, now: float, step: StepState) -> tuple[ClusterView, RolloutProgress]:
        """The ClusterView from the managers' last polls (the hypergraph's nodes, the
        input channel's depth), the devices each component holds and the step's work."""
        graph = self.ctl.refresh_graph()
        accepts, work, config = step.live.accepts, step.work, self.config
        donor = self.donor
        spec = donor.spec
        queued = graph.queued(spec.inbox) if spec.inbox is not None else 0
        progress = rollout_progress(donor.reports, donor.finished)
        drained = queued == 0 and accepts(spec.name)
        stage = step.live.done.get(spec.name)
        finished = stage is not None and stage.done()
        """Its stage is over for this step: every engine idles until the step's end, so all
        of its devices may go to the components still working (the bottleneck)."""
        graph.observe_interruptible(spec.name, drained)
        demand = rollout_demand(progress, donor.peak, config.pack)
        low = donor.low()
        if config.donor == "packable":
            donor.packable = packable_since(len(low), demand, config.theta, now, donor.packable)
            if donor.packable is not None:
                low = (donor.packable,) * len(low)
        counts = self.mover.holdings.counts if self.mover is not None else {
            name: len(m.group.devices) for name, m in self.managers.items()}

        def lendable(name: str, finished: bool) -> int | None:
            """A finished component's devices that no barrier component holds too."""
            if not finished or self.mover is None:
                return None
            barrier = {d for n, m in self.managers.items() if m.spec.barrier for d in self.mover.held(n)}
            return sum(1 for d in self.mover.held(name) if d not in barrier)
        views = [ComponentView(
            spec.name, "dynamic", counts[spec.name], rollout_tokens_left(progress, work.cap),
            devices_per_engine=spec.devices_per_engine, min_devices=spec.min_devices,
            interruptible=donor.gate.interruptible and (drained or finished or rollout_done(progress, queued)),
            active_requests=progress.active, keep_engines=demand,
            move_cost_s=donor.move_cost_s, engine_low_since=low, engine_kv=tuple(r.kv for r in donor.reports),
            moved_token_s=max((r.moved_token_s for r in donor.reports), default=0.0),
            finished=finished, idle_engines=sum(1 for r in donor.reports if r.running + r.waiting == 0),
            lendable=lendable(spec.name, finished))]
        for name, m in self.managers.items():
            if m is donor:
                continue
            accepting = accepts(name)
            stage = step.live.done.get(name)
            done = not accepting and stage is not None and stage.done()
            tokens, samples = m.processed()
            views.append(ComponentView(
                name, "static", counts[name], stage_tokens_left(work, progress, tokens, samples) if accepting else 0.0,
                devices_per_engine=m.spec.unit or m.spec.devices_per_engine, min_devices=m.spec.min_devices,
                interruptible=m.gate.interruptible and accepting and m.spec.strategy is not None,
                move_cost_s=m.move_cost_s, barrier=m.spec.barrier, finished=done,
                lendable=lendable(name, done)))
        return ClusterView(now, tuple(views)), progress
