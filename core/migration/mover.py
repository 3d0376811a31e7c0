"""Executing the scheduler's plans on a running step: the one executor of
`dynarl train` and `dynarl sim`. Who holds which device is one value (holdings.py
Holdings) and each plan a pure function of it; this class carries them out, with the
step's rank handle (step.py Joins: joins.py StepRanks) the workflow gave it.

    donor -> receiver  the donor (the rollout) shrinks by Workload migration (workload.py),
                       then the receiver grows: `join` (its running stage takes ranks on the
                       freed devices; a stateful one receives its state peer-to-peer) or
                       `p2p` (a sharded trainer reshards onto them, create before destroy)
    barrier            once every pipelined stage is done, the finished ones lend the barrier
                       trainer their devices it does not share, in its units (barrier_shares):
                       the rollout's engines but one are parked, its last engine and
                       inference's ranks free their memory and stay until the step's end
    lending            (optional) while inference and the trainer have nothing to do, the
                       rollout runs on their devices too; the first move, or the rollout's
                       end, gives them back
    tail-TP            (optional) after each move the kept engines merge pairwise into
                       engines of twice the TP (tail_tp.py)
    restore            at the step's end, back to the configured placement (restore_plan)

Ranks are not spawned and stopped per move but parked in warm standby pools
(standby.py). What a move costs on the devices beyond its calls is `MoveCosts`: zero
where the calls do the real work (`dynarl train`), the cost model's where the devices
are emulated (`dynarl sim`, docs/COSTMODEL.md §3). Devices are "in flight" (owned by no
one) between leaving the donor and joining the receiver; every change of ownership is
a DeviceCounts sample in the scheduler's log.
"""
from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Sequence

from dynarl.core.migration.holdings import (Holdings, MoveCosts, barrier_shares, lend_firsts, release_order,
                                            restore_plan)
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.migration.step import Joins, Step
from dynarl.core.migration.tail_tp import widen
from dynarl.core.migration.workload import Taken, workload_migrate
from dynarl.core.roles import LendingRank, ReportingRank
from dynarl.core.scheduler.log import DeviceCounts, Migration, SchedulerLog
from dynarl.core.worker_group import gather_or_cancel

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.remote import AsyncMethod
    from dynarl.core.scheduler.manager import Manager
    from dynarl.core.scheduler.policy import Plan
    from dynarl.core.scheduler.report import RankReport
    from dynarl.core.worker_group import WorkerGroup


class Mover:
    def __init__(self, ctl: "Controller", joins: Joins, managers: dict[str, "Manager"], log: SchedulerLog,
                 costs: MoveCosts = MoveCosts(), *, donor: str = "rollout", lend: bool = False,
                 tail_tp: bool = False, time_scale: float = 1.0) -> None:
        self.ctl, self.joins, self.managers, self.log = ctl, joins, managers, log
        self.costs, self.donor, self.time_scale = costs, donor, time_scale
        self.home = {name: sorted(d + k for d in m.group.devices for k in range(m.spec.devices_per_engine))
                     for name, m in managers.items()}
        """The configured placement (every device of every engine), restored at the end of every step."""
        self.devices = sorted({d for devices in self.home.values() for d in devices})
        """Every device of the configured placement: where a resharding trainer may come to be."""
        self.base_ranks = {name: m.group.world_size for name, m in managers.items()}
        self.lend_enabled = lend
        self.tail_tp = tail_tp
        self.holdings = Holdings({name: len(devices) for name, devices in self.home.items()})
        self.lock = asyncio.Lock()
        self.change()

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def charge(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds * self.time_scale)

    def change(self, **delta: int) -> None:
        """Devices change hands: a DeviceCounts sample in the log."""
        self.holdings = self.holdings.change(**delta)
        self.log.counts.append(DeviceCounts(self.now(), dict(self.holdings.counts)))

    def record(self, kind: str, component: str, devices: list[int], begun: float,
               seconds: float | None = None, kv: Taken | None = None) -> None:
        """A move in the log, begun at loop time `begun`, its cost in emulated seconds
        (`seconds`, else the time since `begun`)."""
        seconds = (self.now() - begun) / self.time_scale if seconds is None else seconds
        if kv is not None:  # its seconds are loop seconds, the log's are emulated ones
            kv = Taken(kv.items, kv.kv_requests, kv.kv_tokens, kv.kv_s / self.time_scale, kv.reprefilled)
        self.log.migrations.append(Migration(kind, component, list(devices), begun, seconds, kv))
        manager = self.managers.get(component)
        if manager is not None:
            manager.cycle_moves.append(seconds)
            manager.observe_group()  # the hypergraph shows the move at once

    def group(self, name: str) -> "WorkerGroup":
        return self.managers[name].group

    def pool(self, name: str) -> StandbyPool:
        manager = self.managers[name]
        if manager.spec.standby is None:
            manager.spec.standby = StandbyPool(self.ctl, manager.group.cls, name, manager.spec.init or {})
        return manager.spec.standby

    @property
    def tp(self) -> int:
        return self.managers[self.donor].spec.devices_per_engine

    def engine_devices(self, first: int) -> list[int]:
        return self.holdings.engine_devices(first, self.tp)

    def held(self, name: str) -> list[int]:
        """Every device the component's ranks run on now (not those lent to the barrier)."""
        lent = set(self.holdings.barrier_lent.get(name, ()))
        return [d for positions in self.rank_devices(name) for d in positions if d not in lent]

    def rank_devices(self, name: str) -> list[list[int]]:
        """Per rank of the component, the devices it runs on."""
        if name == self.donor:
            return [self.engine_devices(h.spec.devices[0]) for h in self.group(name).handles]
        per = self.managers[name].spec.devices_per_engine
        return [[h.spec.devices[0] + k for k in range(per)] for h in self.group(name).handles]

    def positions(self, firsts: Sequence[int]) -> list[int]:
        """The donor ranks whose first device is one of `firsts`."""
        return [p for p, h in enumerate(self.group(self.donor).handles) if h.spec.devices[0] in firsts]

    async def _barrier_call(self, name: str, method: "AsyncMethod[..., Any]", devices: Sequence[int]) -> None:
        """`method` on the component's ranks that run on any of `devices`."""
        on = set(devices)
        ranks = [p for p, ds in enumerate(self.rank_devices(name)) if on & set(ds)]
        if ranks:
            await self.group(name).on(ranks).call(method)

    async def take(self, name: str, devices: list[int]) -> list[int]:
        """Ranks join the component on `devices` (parked, else started); their positions."""
        pool, group = self.pool(name), self.group(name)
        await pool.fill(devices)
        first = group.world_size
        pool.join(group, devices)
        return list(range(first, group.world_size))

    async def execute(self, plan: "Plan", live: Step) -> None:
        if plan.barrier:
            async with self.lock:
                if not self.holdings.lent and plan.moves and live.accepts(plan.moves[0][1]):
                    await self._lend_to_barrier(plan.moves, live)
            return
        for donor, receiver, devices in plan.moves:
            async with self.lock:
                if not live.accepts(receiver):
                    continue  # decided before the receiver finished (its step's work may be done)
                if self.holdings.lent:
                    await self._return_home(live)
                    if self.holdings.lent:
                        continue  # only the lent engines still run: nothing to give yet
                given, self.holdings = self.holdings.spend_credit(receiver)
                moved = await self._free_engines(donor, devices - given, live)
                if moved:
                    await self.grow(receiver, moved, live)
                if self.tail_tp:
                    await self._widen(live)

    async def _widen(self, live: Step) -> None:
        """Tail-TP: the kept engines merge pairwise into wider ones (tail_tp.py)."""
        def widened(members: dict[int, tuple[int, ...]]) -> None:
            self.holdings = replace(self.holdings, wide={**self.holdings.wide, **members})
        try:
            done = await widen(self.ctl, self.joins, self.group(self.donor), self.donor, self.tp,
                               self.holdings.wide, live, widened, lambda: self.charge(self.costs.restart_s),
                               self.time_scale)
        except MigrationFailed as exc:  # rolled back: the engines go on at the base TP
            self.log.failures.append(str(exc))
            return
        if done is not None:
            self.record("reboot", self.donor, [], done[0], kv=done[1])

    async def _free_engines(self, donor: str, devices: int, live: Step) -> list[int]:
        """Donor engines for at most `devices` devices leave (release_order, Workload
        migration, parked); returns their devices (none: nothing moved, and the next
        decision sees the engines as they are)."""
        if devices < self.tp:
            return []
        begun = self.now()
        released = None
        for attempt in range(2):  # again once, on fresh reports, if the kept engines finished meanwhile:
            group = self.group(donor)  # then they can go instead
            loads = await (self.managers[donor].current_reports() if attempt == 0 else
                           group.call(ReportingRank.metrics))
            width = [len(self.engine_devices(h.spec.devices[0])) for h in group.handles]
            release = release_order([x.active_run for x in loads], [x.utilization for x in loads],
                                    width, devices)
            if not release:
                return []
            released = await self._release(donor, release, [loads[p] for p in release], live)
            if released is not None:
                break
        if released is None:
            return []
        freed, taken = released
        moved = [d for first in freed for d in self.engine_devices(first)]
        self.holdings = self.holdings.without_wide(freed)
        self.change(**{donor: -len(moved)})
        await self.charge(self.costs.release_s)
        self.record("workload", donor, moved, begun, kv=taken)
        return moved

    async def _release(self, name: str, positions: list[int], loads: list[RankReport], live: Step
                       ) -> tuple[list[int], Taken | None] | None:
        """Donor engines at `positions` leave, their requests (if any) moved to the others;
        parked, or stopped under tail-TP (they could not rejoin as base engines). Returns
        the freed first devices and what the kept engines took in (None: nothing moved
        with them), or None when the migration failed (nothing moved)."""
        manager, group = self.managers[name], self.group(name)
        manager.note([group.handles[p].spec.worker_id for p in positions], loads)
        park = None if self.tail_tp else self.pool(name)
        async with manager.gate.interrupt():
            if any(load.active_run for load in loads):
                await self.joins.releasing(name, [group.handles[p].spec.worker_id for p in positions],
                                           parked=park is not None)
                try:
                    result = await workload_migrate(self.ctl, group, positions, park=park)
                except MigrationFailed as exc:
                    self.log.failures.append(str(exc))
                    return None
                return result.freed_devices, result.taken
            return await (park.park(group, positions) if park else self.ctl.shrink_group(group, positions)), None

    async def grow(self, target: str, devices: list[int], live: Step) -> None:
        """The receiver takes `devices` by its strategy (p2p: a reshard; else its
        running stage takes new ranks there)."""
        manager = self.managers[target]
        spec = manager.spec
        begun = self.now()
        if spec.strategy == "p2p":
            await self._reshard(target, manager.group.devices + devices)
            self.record("p2p", target, devices, begun)
            self.change(**{target: len(devices)})
            return
        new = await self.take(target, devices)
        await self.joins.ready_ranks(target, manager.group, new, live.version)
        await self.charge(self.costs.state_s + self.costs.switch_s if spec.stateful else self.costs.switch_s)
        self.record("p2p" if spec.stateful else "workload", target, devices, begun)
        self.change(**{target: len(devices)})
        if not live.accepts(target):
            return  # finished meanwhile: the devices wait for the step's end
        for p in new:
            live.add_rank(self.ctl, target, self.joins.stage_call(target, p, live.version))

    async def _lend_to_barrier(self, moves: Sequence[tuple[str, str, int]], live: Step) -> None:
        """The finished donors' devices go to the barrier stage until the step's end
        (barrier_shares); one reshard of the barrier stage takes them all."""
        target = moves[0][1]
        spec = self.managers[target].spec
        wanted = {donor: n for donor, _, n in moves}
        freed: list[int] = []
        if self.donor in wanted:  # (release_order keeps one engine)
            freed = await self._free_engines(self.donor, wanted[self.donor], live)
            wanted[self.donor] -= len(freed)
        held = {donor: self.held(donor) for donor in wanted}
        devices, lent = barrier_shares(freed, held, set(self.held(target)), wanted,
                                       spec.unit or spec.devices_per_engine)
        if lent:  # (freed engines left over wait in flight for the step's end)
            begun = self.now()
            await gather_or_cancel([self._barrier_call(donor, LendingRank.release_devices, ds)
                                    for donor, ds in lent.items()])
            for donor, ds in lent.items():
                self.holdings = self.holdings.lend_to_barrier(donor, ds)
                self.change(**{donor: -len(ds)})
                self.record("switch", donor, ds, begun)
                devices += ds
        if devices:
            await self.grow(target, devices, live)

    async def _reshard(self, name: str, devices: list[int]) -> None:
        """The component's group reshards onto `devices` peer-to-peer (create before
        destroy, onto warm standbys); the workflow gets the new group."""
        manager = self.managers[name]
        async with manager.gate.interrupt():
            manager.group = (await p2p_migrate(self.ctl, manager.group, devices, manager.spec.init or {},
                                               standby=self.pool(name))).group
        await self.joins.replaced(name, manager.group)
        await self.charge(self.costs.state_s + self.costs.switch_s)

    def lendable(self) -> list[str]:
        return [name for name in self.managers if name != self.donor]

    async def lend(self, version: int | None) -> float:
        """Parks the other components (their stages gated at the next step's start) and
        starts rollout engines on their devices (DynaRL Fig 13) with weights `version`
        (None: the weight sync that follows gives them). Returns the seconds it costs
        (a role switch), which the caller spends."""
        tp, parked = self.tp, self.lendable()
        firsts = lend_firsts(sorted({d for name in parked for d in self.home[name]}), tp)  # (time-shared ones once)
        if not firsts:
            return 0.0
        await self._grow_rollout(firsts, version)
        self.holdings = replace(self.holdings, lent=tuple(firsts), parked=tuple(parked), credit={})
        self.change(**{self.donor: len(firsts) * tp}, **{name: -len(self.home[name]) for name in parked})
        return self.costs.switch_s

    async def _grow_rollout(self, devices: Sequence[int], version: int | None) -> None:
        """Rollout engines start on `devices` (one per first device of an engine)."""
        new = await self.take(self.donor, list(devices))
        await self.joins.ready_ranks(self.donor, self.group(self.donor), new, version)

    async def return_home(self, live: Step) -> None:
        """The lent engines go (their requests to the other engines), the parked
        components onload on their own devices and their stages start."""
        async with self.lock:
            if self.holdings.lent:
                await self._return_home(live)

    async def _return_home(self, live: Step) -> None:
        positions = self.positions(self.holdings.lent)
        loads = await self.group(self.donor).on(positions).call(ReportingRank.metrics)
        begun = self.now()
        released = await self._release(self.donor, positions, loads, live)
        if released is None:
            return  # only the lent engines still run: they keep the devices until they finish
        await self.charge(self.costs.release_s)
        self.change(**{self.donor: -len(self.holdings.lent) * self.tp})
        self.holdings = replace(self.holdings, lent=())
        self.record("workload", self.donor, [], begun, kv=released[1])
        begun = self.now()
        await self.charge(self.costs.switch_s)  # the parked components onload: a role switch
        parked = list(self.holdings.parked)
        self.holdings = replace(self.holdings, parked=())
        live.unpark(parked)
        self.record("switch", self.donor, [], begun)
        self.change(**{name: len(self.home[name]) for name in parked})
        self.holdings = replace(self.holdings, credit={name: len(self.home[name]) for name in parked})

    async def restore(self, lend: bool = True) -> None:
        """Back to the configured placement at the step's end (before its weight sync),
        then the next step's lending (`lend`: a step follows). The trainer's state moving
        home, the engines starting and the lending run in parallel."""
        async with self.lock:
            await self._restore(lend and self.lend_enabled)

    async def _restore(self, lend: bool) -> None:
        ms = self.managers
        plan = restore_plan(
            self.holdings, self.home, {n: m.group.devices for n, m in ms.items() if m.spec.strategy == "p2p"},
            {n: range(self.base_ranks[n], m.group.world_size) for n, m in ms.items()
             if n != self.donor and m.spec.strategy != "p2p"},
            [h.spec.devices[0] for h in self.group(self.donor).handles], self.donor, self.tp)
        begun = self.now()
        for name in plan.reshard:  # a resharding trainer goes home first
            old = list(ms[name].group.devices)
            await self._reshard(name, self.home[name])
            self.record("p2p", name, [d for d in old if d not in self.home[name]], begun)
            self.change(**{name: len(self.home[name]) - self.holdings.counts[name]})
        self.holdings = replace(self.holdings, barrier_lent={})
        if plan.reclaim:  # the ranks that lent to the barrier take their memory back
            begun = self.now()
            await gather_or_cancel([self._barrier_call(name, LendingRank.reclaim_devices, devices)
                                    for name, devices in plan.reclaim.items()])
            self.change(**{name: len(devices) for name, devices in plan.reclaim.items()})
            for name, devices in plan.reclaim.items():
                self.record("switch", name, list(devices), begun)
        if plan.nothing_else:
            if lend:
                await self.charge(await self.lend(None))
            return
        begun = self.now()
        stateful = [name for name, positions in plan.park.items() if positions and ms[name].spec.stateful]
        for name, positions in plan.park.items():
            if positions:
                await self.pool(name).park(self.group(name), positions)
                self.change(**{name: -len(positions)})
        group = self.group(self.donor)
        if self.holdings.lent:  # still lent (the rollout's end gives them back first, as a rule)
            await self.pool(self.donor).park(group, self.positions(plan.park_lent))
            self.change(**{self.donor: -len(self.holdings.lent) * self.tp},
                        **{n: len(self.home[n]) for n in self.holdings.parked})
            self.holdings = replace(self.holdings, lent=(), parked=())
        missing = list(plan.rejoin)
        async with ms[self.donor].gate.interrupt():
            if missing:
                await self._grow_rollout(missing, None)
            if plan.restart:  # the wide engines stop (after the others start: a group is never empty), then
                await self.ctl.shrink_group(group, self.positions(plan.restart))  # restart at base TP
                self.change(**{self.donor: -sum(len(d) for d in self.holdings.wide.values())})
                self.holdings = replace(self.holdings, wide={})
                await self._grow_rollout(plan.restart, None)
                missing += plan.restart
        lend_s = await self.lend(None) if lend else 0.0
        state = self.costs.state_s + self.costs.switch_s if stateful else 0.0
        switch = self.costs.restart_s if plan.restart else self.costs.switch_s
        await self.charge(max(state, switch, lend_s))
        if stateful:
            self.record("p2p", stateful[0], [], begun, seconds=state)
        if missing:
            self.record("join", self.donor, [d for f in missing for d in self.engine_devices(f)], begun,
                        seconds=switch if switch else None)
        self.change(**{self.donor: len(missing) * self.tp})
