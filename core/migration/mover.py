"""Executing the scheduler's plans on a running step: the one executor of
`dynarl train` and `dynarl sim`.

    donor -> receiver     the donor (the rollout) shrinks by Workload migration
                          (workload.py: pause, export the unfinished work with its
                          tokens so far, import it on the kept engines, park the
                          released ones), then the receiver grows by its strategy:
        join              its running stage takes new ranks on the freed devices
                          (a streaming stage: inference, a streaming trainer); a
                          stateful one (the trainer) receives its state peer-to-peer
        p2p               a sharded trainer reshards onto its devices plus the freed
                          ones, create before destroy (p2p.py; the barrier trainer)
    barrier               once every pipelined stage is done, the finished ones give
                          the barrier trainer (p2p, one reshard) their devices it does
                          not share, in its units:
                          the rollout's engines but one are parked as in any move,
                          and its last engine and inference's ranks free their memory
                          and stay in their groups until the step's end
    lending               (optional) while inference and the trainer have nothing to
                          do, the rollout runs on their devices too (they are parked,
                          their stages gated); the first move, or the rollout's end,
                          gives the devices back
    tail-TP               (optional) after each move the kept engines merge pairwise
                          into engines of twice the TP (tail_tp.py)
    restore               at the step's end, back to the configured placement: the
                          receivers' extra ranks are parked (a p2p trainer reshards
                          home), the ranks that lent to the barrier take their memory
                          back, the rollout's parked engines rejoin, and the next
                          step's lending is set up

Ranks are not spawned and stopped per move but parked in warm standby pools
(standby.py): a released engine waits there until its devices come back, a
receiver adopts parked ranks of its class.

What a move costs on the devices beyond the calls it makes is `MoveCosts`: zero
where those calls do the real work (`dynarl train`), the cost model's where the
devices are emulated (`dynarl sim`, docs/COSTMODEL.md §3). Devices are "in flight"
(owned by no one) between leaving the donor and joining the receiver; every change
of ownership is a DeviceCounts sample in the scheduler's log.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Protocol, Sequence

from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.migration.tail_tp import widen
from dynarl.core.migration.workload import Taken, workload_migrate
from dynarl.core.scheduler.log import DeviceCounts, Migration, SchedulerLog
from dynarl.core.worker_group import gather_or_cancel

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.scheduler.manager import Manager
    from dynarl.core.scheduler.policy import Plan
    from dynarl.core.worker_group import WorkerGroup


@dataclass(frozen=True, slots=True)
class MoveCosts:
    """Seconds a move costs on the devices beyond the calls it makes."""
    release_s: float = 0.0
    """Released engines pause and offload before their devices are free."""
    switch_s: float = 0.0
    """A role switch: one role offloads, another onloads."""
    restart_s: float = 0.0
    """A role switch that restarts an engine (at another TP)."""
    state_s: float = 0.0
    """A stateful component's (the trainer's) state over one device link."""


class Step(Protocol):
    """The running step as a move sees it (components/workflows/live.py LiveStep)."""
    version: int
    extras: dict[str, list[asyncio.Future]]

    def accepts(self, component: str) -> bool: ...
    def add_rank(self, ctl: "Controller", component: str, call: Awaitable[Any]) -> None: ...
    def park(self, components: Sequence[str]) -> None: ...
    def unpark(self, components: Sequence[str]) -> None: ...


class Workflow(Protocol):
    """What a move asks of the workflow whose groups it changes (grpo.py)."""

    async def releasing(self, component: str, ranks: list[str], parked: bool = False) -> None: ...
    async def ready_ranks(self, component: str, group: "WorkerGroup", positions: list[int], version: int | None,
                          ) -> None: ...
    def stage_call(self, component: str, position: int, version: int) -> Awaitable[Any]: ...
    async def joined(self, component: str, ranks: list[str]) -> None: ...
    def rank_init(self, component: str, tp: int | None = None) -> dict[str, Any]: ...
    async def replaced(self, component: str, group: "WorkerGroup") -> None:
        """A move replaced the component's group (a P2P reshard): the workflow uses it from
        now on (and what follows the component's devices moves with it: ppo's critic)."""


def release_order(active: Sequence[bool], utilization: Sequence[float], width: Sequence[int],
                  devices: int) -> list[int]:
    """Pure: the donor engines to release for at most `devices` devices: finished
    engines first, then the emptiest; never all of them, nor the last engine whose
    generation still runs (its requests would have nowhere to go)."""
    order = sorted(range(len(active)), key=lambda p: (active[p], utilization[p], p))
    running = sum(active)
    release: list[int] = []
    taken = 0
    for p in order:
        if len(release) >= len(active) - 1:
            break
        if taken + width[p] > devices:
            continue
        if active[p]:
            if running == 1:
                break
            running -= 1
        release.append(p)
        taken += width[p]
    return release


class Mover:
    def __init__(self, ctl: "Controller", wf: Workflow, managers: dict[str, "Manager"], log: "SchedulerLog",
                 costs: MoveCosts = MoveCosts(), *, donor: str = "rollout", lend: bool = False,
                 tail_tp: bool = False, time_scale: float = 1.0) -> None:
        self.ctl, self.wf, self.managers, self.log = ctl, wf, managers, log
        self.costs, self.donor, self.time_scale = costs, donor, time_scale
        self.home = {name: sorted(d + k for d in m.group.devices for k in range(m.spec.devices_per_engine))
                     for name, m in managers.items()}
        """The configured placement (every device of every engine), restored at the end of every step."""
        self.devices = sorted({d for devices in self.home.values() for d in devices})
        """Every device of the configured placement: where a resharding trainer may come to be."""
        self.base_ranks = {name: m.group.world_size for name, m in managers.items()}
        self.counts = {name: len(devices) for name, devices in self.home.items()}
        """Devices each component holds now (lent and in-flight devices counted right)."""
        self.lend_enabled = lend
        self.lent: list[int] = []
        """First device of each rollout engine running on the parked components' home devices."""
        self.parked: list[str] = []
        """Components whose devices the rollout holds (their stages wait)."""
        self.credit: dict[str, int] = {}
        """Home devices returned to a component and not yet counted against a move to it."""
        self.tail_tp = tail_tp
        self.wide: dict[int, list[int]] = {}
        """First device of each wide rollout engine -> every device it runs on."""
        self.barrier_lent: dict[str, list[int]] = {}
        """Finished component -> its devices the barrier stage holds until the step's end."""
        self.lock = asyncio.Lock()
        self.change()

    # --- bookkeeping ----------------------------------------------------------------

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def charge(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds * self.time_scale)

    def change(self, **delta: int) -> None:
        """Devices change hands: a DeviceCounts sample in the log."""
        for name, d in delta.items():
            self.counts[name] += d
        self.log.counts.append(DeviceCounts(self.now(), dict(self.counts)))

    def record(self, kind: str, component: str, devices: list[int], begun: float,
               seconds: float | None = None, kv: Taken | None = None) -> None:
        """A move in the log: started at loop time `begun`; its cost in emulated seconds
        (`seconds`, as charged, or the time since `begun` over the time scale)."""
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
        """The devices of the donor engine whose first device is `first`."""
        return self.wide.get(first) or [first + k for k in range(self.tp)]

    def held(self, name: str) -> list[int]:
        """Every device the component's ranks run on now (not those lent to the barrier)."""
        lent = set(self.barrier_lent.get(name, ()))
        return [d for positions in self.rank_devices(name) for d in positions if d not in lent]

    def rank_devices(self, name: str) -> list[list[int]]:
        """Per rank of the component, the devices it runs on."""
        if name == self.donor:
            return [self.engine_devices(h.spec.devices[0]) for h in self.group(name).handles]
        per = self.managers[name].spec.devices_per_engine
        return [[h.spec.devices[0] + k for k in range(per)] for h in self.group(name).handles]

    async def _barrier_call(self, name: str, method: str, devices: list[int]) -> None:
        """`method` on the component's ranks that run on any of `devices`."""
        on = set(devices)
        ranks = [p for p, ds in enumerate(self.rank_devices(name)) if on & set(ds)]
        if ranks:
            await self.group(name).call(method, ranks=ranks)

    async def take(self, name: str, devices: list[int]) -> list[int]:
        """Ranks of the component's class join its group on `devices` (parked ones,
        else started); returns their positions."""
        pool, group = self.pool(name), self.group(name)
        await pool.fill(devices)
        first = group.world_size
        pool.join(group, devices)
        return list(range(first, group.world_size))

    # --- a plan's moves -------------------------------------------------------------

    async def execute(self, plan: "Plan", live: Step) -> None:
        if plan.barrier:
            async with self.lock:
                if not self.lent and plan.moves and live.accepts(plan.moves[0][1]):
                    await self._lend_to_barrier(plan.moves, live)
            return
        for donor, receiver, devices in plan.moves:
            async with self.lock:
                if not live.accepts(receiver):
                    continue  # decided before the receiver finished (its step's work may be done)
                if self.lent:
                    await self._return_home(live)
                    if self.lent:
                        continue  # only the lent engines still run: nothing to give yet
                credit = self.credit.pop(receiver, 0)
                await self._move(donor, receiver, devices - credit, live)
                if self.tail_tp:
                    try:
                        await widen(self, live)
                    except MigrationFailed as exc:  # rolled back: the engines go on at the base TP
                        self.log.failures.append(str(exc))

    async def _move(self, donor: str, target: str, devices: int, live: Step) -> None:
        moved = await self._free_engines(donor, devices, live)
        if moved:
            await self.grow(target, moved, live)

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
            manager = self.managers[donor]
            loads = await (manager.current_reports() if attempt == 0 else group.call("metrics"))
            width = [len(self.engine_devices(h.spec.devices[0])) for h in group.handles]
            release = release_order([bool(x["active_run"]) for x in loads], [x["kv_utilization"] for x in loads],
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
        for first in freed:
            self.wide.pop(first, None)
        self.change(**{donor: -len(moved)})
        await self.charge(self.costs.release_s)
        self.record("workload", donor, moved, begun, kv=taken)
        return moved

    async def _release(self, name: str, positions: list[int], loads: list[dict], live: Step
                       ) -> tuple[list[int], Taken | None] | None:
        """Donor engines at `positions` leave: their requests move to the others
        (Workload migration), or, with no live run among them, they just go. They are
        parked, unless engines may run at a wider TP (tail-TP), which could not rejoin
        as base engines: those are stopped. Returns the freed first devices and what the
        kept engines took in (the moved requests' KV; None: nothing moved with them), or
        None when the migration failed (nothing moved)."""
        manager, group = self.managers[name], self.group(name)
        manager.note([group.handles[p].spec.worker_id for p in positions], loads)
        park = None if self.tail_tp else self.pool(name)
        async with manager.gate.interrupt():
            if any(load["active_run"] for load in loads):
                await self.wf.releasing(name, [group.handles[p].spec.worker_id for p in positions],
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
        group = manager.group
        await self.wf.ready_ranks(target, group, new, live.version)
        await self.charge(self.costs.state_s + self.costs.switch_s if spec.stateful else self.costs.switch_s)
        self.record("p2p" if spec.stateful else "workload", target, devices, begun)
        self.change(**{target: len(devices)})
        if not live.accepts(target):
            return  # finished meanwhile: the devices wait for the step's end
        for p in new:
            live.add_rank(self.ctl, target, self.wf.stage_call(target, p, live.version))

    async def _lend_to_barrier(self, moves: Sequence[tuple[str, str, int]], live: Step) -> None:
        """The finished donors' devices go to the barrier stage until the step's end: the
        rollout's engines but one leave as in any move (parked), and the ranks left (the
        rollout's last engine, inference's) free their memory and stay in their groups
        until `restore`. One reshard of the barrier stage takes them all."""
        target = moves[0][1]
        spec = self.managers[target].spec
        unit = spec.unit or spec.devices_per_engine
        own = set(self.held(target))
        wanted = {donor: n for donor, _, n in moves}
        freed: list[int] = []
        if self.donor in wanted:  # (release_order keeps one engine)
            freed = await self._free_engines(self.donor, wanted[self.donor], live)
            wanted[self.donor] -= len(freed)
        lent = {donor: [d for d in self.held(donor) if d not in own][:n] for donor, n in wanted.items() if n > 0}
        extra = (len(freed) + sum(map(len, lent.values()))) % unit  # the target takes whole units
        for donor in reversed(list(lent)):
            cut = min(extra, len(lent[donor]))
            lent[donor], extra = lent[donor][:len(lent[donor]) - cut], extra - cut
        devices = freed[:len(freed) - extra]  # (freed engines left over wait in flight for the step's end)
        lent = {donor: held for donor, held in lent.items() if held}
        if lent:
            begun = self.now()
            await gather_or_cancel([self._barrier_call(donor, "release_devices", held) for donor, held in lent.items()])
            for donor, held in lent.items():
                self.barrier_lent.setdefault(donor, []).extend(held)
                self.change(**{donor: -len(held)})
                self.record("switch", donor, held, begun)
                devices += held
        if devices:
            await self.grow(target, devices, live)

    async def _reshard(self, name: str, devices: list[int]) -> None:
        """The component's group reshards onto `devices` peer-to-peer (create before
        destroy, onto warm standbys); the workflow gets the new group."""
        manager = self.managers[name]
        async with manager.gate.interrupt():
            manager.group = (await p2p_migrate(self.ctl, manager.group, devices, manager.spec.init or {},
                                               standby=self.pool(name))).group
        await self.wf.replaced(name, manager.group)
        await self.charge(self.costs.state_s + self.costs.switch_s)

    # --- lending: the rollout runs on the parked components' devices -------------------

    def lendable(self) -> list[str]:
        return [name for name in self.managers if name != self.donor]

    async def lend(self, version: int | None) -> float:
        """Parks the other components (their state in host memory, their stages gated
        at the next step's start) and starts rollout engines on their devices, so the
        rollout holds the whole cluster while nothing else has work (DynaRL Fig 13).
        Returns the seconds it costs (a role switch), which the caller spends.
        `version`: the weights the new engines load (None: the weight sync that
        follows gives them)."""
        tp, parked = self.tp, self.lendable()
        home = sorted({d for name in parked for d in self.home[name]})  # (time-shared ones once)
        firsts = [home[i] for i in range(0, len(home) - tp + 1, tp) if home[i + tp - 1] - home[i] == tp - 1]
        if not firsts:
            return 0.0
        await self._grow_rollout(firsts, version)
        self.lent, self.parked, self.credit = firsts, parked, {}
        self.change(**{self.donor: len(firsts) * tp}, **{name: -len(self.home[name]) for name in parked})
        return self.costs.switch_s

    async def _grow_rollout(self, devices: list[int], version: int | None) -> None:
        """Rollout engines start on `devices` (one per first device of an engine)."""
        new = await self.take(self.donor, devices)
        await self.wf.ready_ranks(self.donor, self.group(self.donor), new, version)

    async def return_home(self, live: Step) -> None:
        """The lent engines go (their requests to the other engines), the parked
        components onload on their own devices and their stages start."""
        async with self.lock:
            if self.lent:
                await self._return_home(live)

    async def _return_home(self, live: Step) -> None:
        group = self.group(self.donor)
        positions = [p for p, h in enumerate(group.handles) if h.spec.devices[0] in self.lent]
        loads = await group.call("metrics", ranks=positions)
        begun = self.now()
        released = await self._release(self.donor, positions, loads, live)
        if released is None:
            return  # only the lent engines still run: they keep the devices until they finish
        await self.charge(self.costs.release_s)
        self.change(**{self.donor: -len(self.lent) * self.tp})
        self.lent = []
        self.record("workload", self.donor, [], begun, kv=released[1])
        begun = self.now()
        await self.charge(self.costs.switch_s)  # the parked components onload: a role switch
        parked, self.parked = self.parked, []
        live.unpark(parked)
        self.record("switch", self.donor, [], begun)
        self.change(**{name: len(self.home[name]) for name in parked})
        self.credit = {name: len(self.home[name]) for name in parked}

    # --- the step's end: back to the configured placement -------------------------------

    async def restore(self, lend: bool = True) -> None:
        """Back to the configured placement at the step's end (before its weight sync,
        which gives every rollout engine the new weights), then the next step's
        lending (`lend`: a step follows). The trainer's state moving home (p2p), the
        engines starting (a role switch) and the lending run in parallel."""
        async with self.lock:
            await self._restore(lend and self.lend_enabled)

    async def _restore(self, lend: bool) -> None:
        begun = self.now()
        for name, manager in self.managers.items():  # a resharding trainer goes home first
            if manager.spec.strategy == "p2p" and sorted(manager.group.devices) != self.home[name]:
                old = list(manager.group.devices)
                await self._reshard(name, self.home[name])
                self.record("p2p", name, [d for d in old if d not in self.home[name]], begun)
                self.change(**{name: len(self.home[name]) - self.counts[name]})
        lent, self.barrier_lent = self.barrier_lent, {}
        if lent:  # the ranks that lent to the barrier take their memory back
            begun = self.now()
            await gather_or_cancel([self._barrier_call(name, "reclaim_devices", devices)
                                    for name, devices in lent.items()])
            self.change(**{name: len(devices) for name, devices in lent.items()})
            for name, devices in lent.items():
                self.record("switch", name, devices, begun)
        extra = {name: list(range(self.base_ranks[name], m.group.world_size)) for name, m in self.managers.items()
                 if name != self.donor and m.spec.strategy != "p2p"}
        wide = sorted(self.wide)  # first devices of the wide engines: back to base TP below
        if not any(extra.values()) and not wide and not self.lent and not self._missing():
            if lend:
                await self.charge(await self.lend(None))
            return
        begun = self.now()
        stateful = [name for name, positions in extra.items() if positions and self.managers[name].spec.stateful]
        for name, positions in extra.items():
            if positions:
                await self.pool(name).park(self.group(name), positions)
                self.change(**{name: -len(positions)})
        group = self.group(self.donor)
        if self.lent:  # still lent (the rollout's end gives them back first, as a rule)
            await self.pool(self.donor).park(group, [p for p, h in enumerate(group.handles)
                                                      if h.spec.devices[0] in self.lent])
            self.change(**{self.donor: -len(self.lent) * self.tp}, **{n: len(self.home[n]) for n in self.parked})
            self.lent, self.parked = [], []
        missing = self._missing()
        async with self.managers[self.donor].gate.interrupt():
            if missing:
                await self._grow_rollout(missing, None)
            if wide:  # the wide engines stop (after the others start: a group is never empty) and restart at base TP
                await self.ctl.shrink_group(group, [p for p, h in enumerate(group.handles)
                                                    if h.spec.devices[0] in self.wide])
                self.change(**{self.donor: -sum(len(d) for d in self.wide.values())})
                self.wide = {}
                await self._grow_rollout(wide, None)
                missing += wide
        lend_s = await self.lend(None) if lend else 0.0
        state = self.costs.state_s + self.costs.switch_s if stateful else 0.0
        switch = self.costs.restart_s if wide else self.costs.switch_s
        await self.charge(max(state, switch, lend_s))
        if stateful:
            self.record("p2p", stateful[0], [], begun, seconds=state)
        if missing:
            self.record("join", self.donor, [d for f in missing for d in self.engine_devices(f)], begun,
                        seconds=switch if switch else None)
        self.change(**{self.donor: len(missing) * self.tp})

    def _missing(self) -> list[int]:
        """First devices of the donor's home engines no engine holds now."""
        held = {h.spec.devices[0] for h in self.group(self.donor).handles}
        return [d for d in self.home[self.donor][::self.tp] if d not in held]
