"""Executing an online scheduler's Migrate decisions in the simulated run (dynarl).

    rollout -> receiver   the rollout shrinks by Workload migration (core/migration/
                          workload.py: pause, export the unfinished groups with their
                          requests' tokens so far, import them on the kept engines,
                          stop the released ranks), then the receiver grows:
        trainer   p2p     new data-parallel ranks on the freed devices. The real P2P
                          transfer needs process groups, so it is charged from the cost
                          model: the fp32 trainer state over one device link, plus a
                          role switch (docs/COSTMODEL.md §3)
        inference workload new ranks, which load the current weights and switch roles
    iteration boundary    back to the start placement: the receivers' extra ranks are
                          parked (the trainer's state moves back: p2p cost again) and
                          rollout engines rejoin on the devices (a role switch each)

Ranks are not spawned and stopped per move but parked in warm standby pools
(core/migration/standby.py), as in real runs: a released engine waits there until
its devices come back, a receiver adopts parked ranks of its class. In virtual time
that changes no timing (a spawn costs no time there, the moves are charged from the
cost model); on the local launcher it keeps process start-up (~0.8 s each on this
machine, 8 s of emulated time at time_scale 0.1) out of the measured iteration.

Devices are "in flight" (owned by no one) between leaving the rollout and joining the
receiver. Every change is an ownership event, so the timeline shows each move.
"""
from __future__ import annotations

import asyncio
import math
from typing import Any

from dynarl.components import costmodel as cm
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.placement.policy import Migrate
from dynarl.components.trainer.base import STATE_NAMES
from dynarl.components.workflows.live import LiveStep
from dynarl.core.controller import Controller
from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.migration.workload import workload_migrate

from .ranks import Ownership, WorkflowRanks
from .scenario import Scenario
from .tail_tp import widen

WORKLOAD_MIGRATION_S = cm.ROLE_SWITCH_S / 2
"""The released engines pause and offload (half a role switch) before their devices are
free; the kept engines re-prefill the imported requests' tokens in the emulation itself."""


def trainer_state_bytes(scn: Scenario) -> int:
    """fp32 master weights, two Adam moments and the gradient, plus the bf16 weights."""
    numel = scn.weight_bytes // cm.BYTES_PER_PARAM
    return numel * (len(STATE_NAMES) * 4 + cm.BYTES_PER_PARAM)


def p2p_cost_s(scn: Scenario) -> float:
    """The trainer's state over one device link, plus a role switch (create-before-destroy)."""
    return trainer_state_bytes(scn) / cm.get_device(scn.config.device).link_bandwidth + cm.role_switch_time()


def min_devices(scn: Scenario) -> dict[str, int]:
    """The trainer's state must fit in its devices' memory (at the engines' mem_util)."""
    spec = cm.get_device(scn.config.device)
    return {"trainer": max(1, math.ceil(trainer_state_bytes(scn) / (cm.DEFAULT_MEM_UTIL * spec.memory_bytes))),
            "inference": 1, "rollout": scn.rollout_tp}


class Migrator:
    def __init__(self, ctl: Controller, scn: Scenario, base: Placement, record, now, borrow: bool = False,
                 tail_tp: bool = False, *, ranks: WorkflowRanks) -> None:
        self.ctl, self.scn, self.base = ctl, scn, base
        self.ranks = ranks
        self.finished_seen: dict[str, tuple[int, int]] = {}
        """Rollout engine -> (requests finished, their output tokens) this iteration, as of
        its last report: every metrics poll, and the load read just before it is released
        (so an engine given away keeps what it finished). The scheduler's view sums it."""
        self.record = record  # record(kind, seconds)
        self.now = now
        self.ts = scn.config.time_scale
        self.own = Ownership([(0.0, {c: base.num_devices_of(c) for c in COMPONENTS})])
        self.trainer_base = base.num_devices_of("trainer")
        self.inference_base = base.num_devices_of("inference")
        self.borrow = borrow
        self.home = {c: base.device_ids(c) for c in ("inference", "trainer")}
        self.lent: list[int] = []
        """First device of each rollout engine running on the parked components' home devices."""
        self.credit: dict[str, int] = {}
        """Home devices returned to a component and not yet counted against a Migrate to it."""
        self.lock = asyncio.Lock()
        self.tail_tp = tail_tp
        """After each move the kept engines merge into wider-TP engines (tail_tp.py)."""
        self.wide: dict[int, list[int]] = {}
        """First device of each wide rollout engine -> every device it runs on."""
        self.pools: dict[str, StandbyPool] = {}
        """Parked ranks per component (standby.py), made on first use."""

    def pool(self, group) -> StandbyPool:
        """The standby pool of `group`'s component (its name: rollout, inference, trainer)."""
        if group.name not in self.pools:
            self.pools[group.name] = StandbyPool(self.ctl, group.cls, group.name, self.ranks.pool_init(group))
        return self.pools[group.name]

    def note_finished(self, engines: list[str], loads: list[dict]) -> None:
        """Records rollout engines' finished counts from their load reports."""
        for engine, load in zip(engines, loads):
            self.finished_seen[engine] = (load["finished"], load["finished_tokens"])

    async def _release(self, g: Any, positions: list[int], loads: list[dict],
                       live: LiveStep) -> list[int] | None:
        """Rollout engines at `positions` leave: their requests move to the others
        (Workload migration), or, with no live run among them, they just go. They are
        parked, unless engines may run at a wider TP (tail_tp), which could not rejoin
        as base engines: those are stopped. Returns the freed first devices, or None
        when the migration failed (nothing moved)."""
        self.note_finished([g.rollout.handles[p].spec.worker_id for p in positions], loads)
        park = None if self.tail_tp else self.pool(g.rollout)
        if any(load["active_run"] for load in loads):
            await self.ranks.releasing(g, positions)
            try:
                return (await workload_migrate(self.ctl, g.rollout, positions, park=park)).freed_devices
            except MigrationFailed:
                return None
        return await (park.park(g.rollout, positions) if park else self.ctl.shrink_group(g.rollout, positions))

    async def take(self, group, devices: list[int]) -> list[int]:
        """Ranks of `group`'s class join it on `devices` (parked ones, else started);
        returns their positions."""
        pool = self.pool(group)
        await pool.fill(devices)
        first = group.world_size
        pool.join(group, devices)
        return list(range(first, group.world_size))

    def engine_devices(self, first: int) -> list[int]:
        """The devices of the rollout engine whose first device is `first`."""
        return self.wide.get(first) or [first + k for k in range(self.scn.rollout_tp)]

    async def execute(self, g: Any, d: Migrate, live: LiveStep) -> None:
        if self.base.mode != "spatial":
            raise NotImplementedError(f"Migrate on a time-shared placement ({self.base.describe()}): "
                                      "online migrations move devices between segments of their own")
        if d.source != "rollout":
            raise NotImplementedError(f"only the rollout donates devices, not {d.source}")
        async with self.lock:
            if not live.accepts(d.target):
                return  # decided before the receiver finished the iteration (the weight sync may be past)
            if self.lent:
                await self._return_home(g, live)
            credit = self.credit.pop(d.target, 0)
            await self._move(g, d.target, d.devices - credit, live)
            if self.tail_tp:
                try:
                    await widen(g, live, self)
                except MigrationFailed:
                    pass  # rolled back: the engines go on at the base TP

    async def _move(self, g: Any, target: str, devices: int, live: LiveStep) -> None:
        if devices < self.scn.rollout_tp:
            return
        loads = await g.rollout.call(self.ranks.load_method)
        width = [len(self.engine_devices(h.spec.devices[0])) for h in g.rollout.handles]
        # finished engines first, then the emptiest; never the last engine with a live run
        order = sorted(range(g.rollout.world_size),
                       key=lambda p: (loads[p]["active_run"], loads[p][self.ranks.utilization], p))
        running = sum(1 for load in loads if load["active_run"])  # live runs not (yet) released
        release: list[int] = []
        taken = 0
        for p in order:
            if len(release) >= g.rollout.world_size - 1:
                break
            if taken + width[p] > devices:
                continue  # (engines of one width: once one does not fit, none does)
            if loads[p]["active_run"]:
                if running == 1:
                    break
                running -= 1
            release.append(p)
            taken += width[p]
        if not release:
            return
        begun = self.now()
        freed = await self._release(g, release, [loads[p] for p in release], live)
        if freed is None:
            return  # the kept engines finished meanwhile: nothing moved, the next decision sees that
        devices = [d for first in freed for d in self.engine_devices(first)]
        for first in freed:
            self.wide.pop(first, None)
        self.own.change(self.now(), rollout=-len(devices))
        await asyncio.sleep(WORKLOAD_MIGRATION_S * self.ts)
        self.record("workload", self.now() - begun)
        await self.grow(g, target, devices, live)

    async def grow(self, g: Any, target: str, devices: list[int], live: LiveStep) -> None:
        begun = self.now()
        group = g.trainer if target == "trainer" else g.inference
        new = await self.take(group, devices)
        if target == "trainer":
            await self.ranks.start(group, new)
            await asyncio.sleep(p2p_cost_s(self.scn) * self.ts)
            kind = "p2p"
        else:
            await self.ranks.load_weights(g, group, new, live.version)
            await asyncio.sleep(cm.role_switch_time() * self.ts)
            kind = "workload"
        self.record(kind, self.now() - begun)
        self.own.change(self.now(), **{target: len(devices)})
        if not live.accepts(target):
            return  # finished meanwhile: the devices wait for the iteration boundary
        for p in new:
            live.add_rank(self.ctl, target, self.ranks.stage_call(group, target, p, live.version))

    # --- the rollout borrows the parked components' devices (dynarl's start) -----------

    async def lend(self, g: Any, version: int, live: Any = None) -> float:
        """Parks inference and trainer (state offloaded to host memory) and starts rollout
        engines on their devices, so the rollout holds the whole cluster while nothing
        else has work (DynaRL Fig 13). Returns the seconds it costs (a role switch),
        which the caller spends (restore overlaps it with its own)."""
        tp = self.scn.rollout_tp
        home = sorted(self.home["inference"] + self.home["trainer"])
        firsts = [home[i] for i in range(0, len(home) - tp + 1, tp) if home[i + tp - 1] - home[i] == tp - 1]
        if not firsts:
            return 0.0
        await self.ranks.park(g, live)
        await self._grow_rollout(g, firsts, version)
        self.lent = firsts
        self.credit = {}
        self.own.change(self.now(), rollout=len(firsts) * tp, inference=-len(self.home["inference"]),
                        trainer=-len(self.home["trainer"]))
        return cm.role_switch_time()

    async def _grow_rollout(self, g: Any, devices: list[int], version: int) -> None:
        """Rollout engines start on `devices` (one per first device of a TP group) and
        receive weight version `version` over the network."""
        new = await self.take(g.rollout, devices)
        await g.rollout.call("workload_resume", ranks=new)  # a parked engine was paused when it left
        await self.ranks.load_weights(g, g.rollout, new, version)

    async def return_home(self, g: Any, live: LiveStep) -> None:
        """The lent engines go (their requests to the other engines), inference and
        trainer onload on their own devices and take their stages' input."""
        async with self.lock:
            if self.lent:
                await self._return_home(g, live)

    async def _return_home(self, g: Any, live: LiveStep) -> None:
        positions = [p for p, h in enumerate(g.rollout.handles) if h.spec.devices[0] in self.lent]
        loads = await g.rollout.call(self.ranks.load_method, ranks=positions)
        begun = self.now()
        if await self._release(g, positions, loads, live) is None:
            return  # only the lent engines still run: they keep the devices until they finish
        await asyncio.sleep(WORKLOAD_MIGRATION_S * self.ts)  # the lent engines pause and offload
        self.own.change(self.now(), rollout=-len(self.lent) * self.scn.rollout_tp)
        self.lent = []
        self.record("workload", self.now() - begun)
        # Both onload (trainer: its state from host memory; inference: the weights): a role switch.
        await asyncio.sleep(cm.role_switch_time() * self.ts)
        await self.ranks.unpark(g, live)
        self.record("switch", cm.role_switch_time())
        self.own.change(self.now(), inference=len(self.home["inference"]), trainer=len(self.home["trainer"]))
        self.credit = {c: len(self.home[c]) for c in self.home}

    async def restore(self, g: Any, version: int, live: Any = None) -> None:
        """Back to the start placement at an iteration boundary (before iteration `version`)."""
        self.finished_seen = {}
        extra_t = list(range(self.trainer_base, g.trainer.world_size))
        extra_i = list(range(self.inference_base, g.inference.world_size))
        wide = sorted(self.wide)  # first devices of the wide engines: back to base TP below
        if not extra_t and not extra_i and not wide:
            if self.borrow:
                await asyncio.sleep(await self.lend(g, version, live) * self.ts)
            return
        if extra_t:
            await self.pool(g.trainer).park(g.trainer, extra_t)
        if extra_i:
            await self.pool(g.inference).park(g.inference, extra_i)
        self.own.change(self.now(), trainer=-len(extra_t), inference=-len(extra_i))
        held = {h.spec.devices[0] for h in g.rollout.handles}
        missing = [d for d in self.base.device_ids("rollout")[::self.scn.rollout_tp] if d not in held]
        await self._grow_rollout(g, missing, version)
        if wide:  # the wide engines stop (after the others start: a group is never empty) and restart at base TP
            await self.ctl.shrink_group(g.rollout, [p for p, h in enumerate(g.rollout.handles)
                                                    if h.spec.devices[0] in self.wide])
            self.own.change(self.now(), rollout=-sum(len(d) for d in self.wide.values()))
            self.wide = {}
            await self._grow_rollout(g, wide, version)
            missing += wide
        lend_s = await self.lend(g, version, live) if self.borrow else 0.0
        # The trainer's state moves back (p2p) while the engines start (a role switch): in parallel.
        p2p = p2p_cost_s(self.scn) if extra_t else 0.0
        switch = cm.role_switch_time(restart=bool(wide))
        await asyncio.sleep(max(p2p, switch, lend_s) * self.ts)
        if extra_t:
            self.record("p2p", p2p)
        self.record("workload", switch)
        self.own.change(self.now(), rollout=len(missing) * self.scn.rollout_tp)
