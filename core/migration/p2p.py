"""P2P migration of a sharded trainer: create before destroy.

1. spawn the new ranks on the destination devices and build their DP group;
2. plan the reshard from the old layout to the new (core/reshard_plan.py);
3. build a transfer group (old ranks, then new ranks) and move every slice of
   params, optimizer moments and grad buffers peer-to-peer;
4. the new ranks install their shards (a collective in their DP group) and
   confirm; the controller checks their ranges tile the state and the step;
5. only then stop the old ranks. On any failure before the switch, the new ranks
   are stopped and their groups destroyed: the old trainer never stopped, so
   training continues there with nothing lost.

With a StandbyPool (standby.py), step 1 adopts warm parked ranks instead of
spawning processes, and step 5 parks the old ranks (state dropped, DP group
left) instead of stopping them: the same protocol at a fraction of the cost, so
a move fits inside a rollout's long tail. New ranks of a rolled-back migration
are stopped either way.

The trainer ranks are ReshardableRanks (core/roles.py; components/trainer/reshard.py):
`start(dp_group, **start)` builds a fresh trainer in the new group, and with a
standby pool `reshard_retire()` drops an old rank's state before it is parked. Their
results are records (reshard_records.py): a RangeLayout (flat ranges: the controller
plans the transfers) or a BoxLayout (a model-parallel trainer: TP x DP, whose ranks
plan their own copies from both layouts: reshard_send_boxes / reshard_recv_boxes;
`start` then may carry the new layout's own settings, e.g. tensor_parallel_size), and
the digest of each kind the new ranks confirm with.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence, TypeVar

from dynarl.core.migration.reshard_records import BoxDigest, BoxLayout, RangeDigest, RangeLayout, StateDigest
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.reshard_plan import flat_layout, plan_reshard
from dynarl.core.roles import ReshardableRank
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel
from dynarl.transport.errors import DynarlError

if TYPE_CHECKING:
    from dynarl.core.controller import Controller

log = logging.getLogger(__name__)
_generations = itertools.count(1)
K = TypeVar("K")


class MigrationFailed(DynarlError):
    """A migration was rolled back; the component keeps running where it was."""


@dataclass(slots=True)
class P2PResult:
    group: WorkerGroup
    dp_group: str | None
    elements_moved: int
    transfers: int
    """Point-to-point messages planned (-1: the ranks planned their own, boxes)."""
    seconds: float
    phases: dict[str, float]
    """Seconds per phase: create, plan, transfer, install, destroy."""


async def p2p_migrate(ctl: "Controller", old: WorkerGroup, devices: list[int], init: dict[str, Any], *,
                      dp_group_prefix: str = "trainer_dp", timeout_s: float = 120.0,
                      standby: StandbyPool | None = None, start: dict[str, Any] | None = None) -> P2PResult:
    loop = asyncio.get_running_loop()
    started = loop.time()
    gen = next(_generations)
    name = f"{old.name.split('@')[0]}@{gen}"
    new_dp = f"{dp_group_prefix}@{gen}" if len(devices) > 1 else None
    transfer_group = f"reshard@{gen}"
    layouts = await old.call(ReshardableRank.reshard_layout)
    digests = await old.call(ReshardableRank.state_digest)
    total = layouts[0].total_numel
    boxes = isinstance(layouts[0], BoxLayout)
    new: WorkerGroup | None = None
    phases: dict[str, float] = {}
    mark = loop.time()

    def phase(name: str) -> None:
        nonlocal mark
        now = loop.time()
        phases[name] = now - mark
        mark = now

    try:
        async with asyncio.timeout(timeout_s):
            if standby is not None and standby.has(devices):
                new = standby.adopt(devices, name)
            else:
                new = await ctl.spawn(old.cls, name=name, devices=devices, init=init, threads=old.threads)
            if new_dp is not None:
                await ctl.process_group(new_dp, [new])
            await new.call(ReshardableRank.start, new_dp, **(start or {}))
            phase("create")
            new_layouts = await new.call(ReshardableRank.reshard_layout)
            await ctl.process_group(transfer_group, [old, new])
            offset = old.world_size  # new rank r is rank offset + r of the transfer group
            if boxes:  # each rank plans its own copies from the two layouts
                transfers = -1
                old_layout = _all_of(BoxLayout, layouts, "old")[0]
                new_layout = _all_of(BoxLayout, new_layouts, "new")[0]
                calls = [old.call(ReshardableRank.reshard_send_boxes, transfer_group, old_layout, new_layout, offset),
                         new.call(ReshardableRank.reshard_recv_boxes, transfer_group, old_layout, new_layout)]
            else:
                old_ranges = _all_of(RangeLayout, layouts, "old")
                new_ranges = _all_of(RangeLayout, new_layouts, "new")
                plan = _flat_plan(old_ranges, new_ranges, total)
                transfers = len(plan)
                wire = [[t.key, t.src, offset + t.dst, t.offset[0], t.shape[0], tag] for tag, t in enumerate(plan)]
                sends = [[transfer_group, [w for w in wire if w[1] == r]] for r in range(old.world_size)]
                recvs = [[transfer_group, [w for w in wire if w[2] == offset + r], *new_ranges[r].ranges["master"][r]]
                         for r in range(new.world_size)]
                calls = [old.scatter(ReshardableRank.reshard_send, sends),
                         new.scatter(ReshardableRank.reshard_recv, recvs)]
            phase("plan")
            sent, received = await gather_or_cancel(calls)
            if sum(sent) != sum(received):
                raise MigrationFailed(f"sent {sum(sent)} elements but received {sum(received)}")
            phase("transfer")
            step = digests[0].step
            confirmed = await new.call(ReshardableRank.reshard_install, step)
            _check_confirmations(confirmed, total, step, digests if boxes else None)
            phase("install")
    except BaseException as exc:
        await _roll_back(ctl, new, [new_dp, transfer_group])
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise MigrationFailed(f"P2P migration of {old.name!r} to devices {devices} rolled back: {exc!r}") from exc
    # The switch: only now do the old ranks go (back to the pool, or stopped).
    if standby is None:
        for name in [transfer_group, *_dp_groups_of(ctl, old, dp_group_prefix)]:  # none may outlive its members
            await ctl.process_groups.destroy(name)
        await ctl.stop_group(old)
    elif not await _retire(ctl, old, [transfer_group, *_dp_groups_of(ctl, old, dp_group_prefix)], standby):
        await ctl.stop_group(old)
    phase("destroy")
    seconds = loop.time() - started
    ctl.tracer.complete("p2p migration", "migration", "migrations", 0, started, loop.time(),
                        {"from": old.name, "to": name, "devices": devices, "elements": sum(sent)})
    return P2PResult(new, new_dp, sum(sent), transfers, seconds, phases)


def _flat_plan(layouts: list[RangeLayout], new_layouts: list[RangeLayout], total: int) -> list:
    def shards(ls: list[RangeLayout]) -> Any:  # each state's range of rank i, as rank i reports it
        return flat_layout({k: [(start, end) for start, end in (r.ranges[k][i] for i, r in enumerate(ls))]
                            for k in ls[0].ranges})
    return plan_reshard(shards(layouts), shards(new_layouts), {k: (total,) for k in layouts[0].ranges})


def _all_of(kind: type[K], records: Sequence[object], who: str) -> list[K]:
    """The ranks' records, each of `kind` (one trainer's ranks report one kind of state)."""
    out = [r for r in records if isinstance(r, kind)]
    if len(out) != len(records):
        other = next(type(r).__name__ for r in records if not isinstance(r, kind))
        raise MigrationFailed(f"the {who} ranks reported a {other} beside a {kind.__name__}")
    return out


def _dp_groups_of(ctl: "Controller", old: WorkerGroup, prefix: str) -> list[str]:
    """The DP group(s) whose members are exactly the old ranks."""
    members = {id(h) for h in old.handles}
    return [name for name, pg in ctl.process_groups.active.items()
            if name.startswith(prefix) and {id(h) for h in pg.members} == members]


async def _retire(ctl: "Controller", old: WorkerGroup, groups: list[str], standby: StandbyPool) -> bool:
    """Parks the old ranks: they leave `groups` (the transfer group, their DP group)
    and drop their state, all at once. False (the caller stops them instead) if that
    fails: a rank that cannot retire cleanly is no standby."""
    try:
        await gather_or_cancel([*(ctl.process_groups.destroy(g) for g in groups),
                                old.call(ReshardableRank.reshard_retire)])
    except Exception as exc:
        log.warning("retiring %s to standby failed, stopping it: %r", old.name, exc)
        return False
    await standby.park(old)
    return True


def _check_confirmations(confirmed: Sequence[StateDigest], total: int, step: int,
                         old: Sequence[StateDigest] | None = None) -> None:
    """New ranks' ranges tile the state at the old step; boxes (`old`: the old ranks'
    digests): their one copies hold the old ones' sums per state kind."""
    if any(c.step != step for c in confirmed):
        raise MigrationFailed("a new rank installed a different optimizer step")
    if old is not None:
        new_boxes, old_boxes = _all_of(BoxDigest, confirmed, "new"), _all_of(BoxDigest, old, "old")
        if sum(c.owned for c in new_boxes) != total:
            raise MigrationFailed(f"new ranks own {sum(c.owned for c in new_boxes)} of {total} elements")
        if any(c.scalars != old_boxes[0].scalars for c in new_boxes):
            raise MigrationFailed(f"a new rank installed other optimizer counters than {old_boxes[0].scalars}")
        for kind in old_boxes[0].sums:
            before, after = (sum(d.sums[kind] for d in ds) for ds in (old_boxes, new_boxes))
            if abs(after - before) > 1e-6 * max(1.0, abs(before)):  # float64 sums in another order
                raise MigrationFailed(f"{kind}: the new ranks hold a sum of {after!r}, the old ones {before!r}")
        return
    ranges = sorted(tuple(c.range) for c in _all_of(RangeDigest, confirmed, "new"))
    position = 0
    for start, end in ranges:
        if start != position:
            raise MigrationFailed(f"new ranks' ranges leave a gap or overlap at {position}")
        position = end
    if position != total:
        raise MigrationFailed(f"new ranks cover {position} of {total} elements")


async def _roll_back(ctl: "Controller", new: WorkerGroup | None, groups: list[str | None]) -> None:
    for group in groups:
        if group is not None:
            try:
                await ctl.process_groups.destroy(group)
            except Exception as exc:  # best effort: the members may be dead
                log.warning("rollback: destroying %s failed: %r", group, exc)
    if new is not None:
        try:
            await ctl.stop_group(new)
        except Exception as exc:
            log.warning("rollback: stopping %s failed: %r", new.name, exc)
