"""Workload migration (rollout, inference, reward, tool): move the work, not the
state. The released ranks pause at a step boundary and export their pending and
in-flight requests (prompt, tokens so far, sampling state); the kept ranks import
and continue them; then the released ranks stop and free their devices.

If handing the work over fails (or loading, pausing or exporting does, on any
rank), items a kept rank imported stay there, the other exported items go back to
the released rank they came from, every rank held open is let go, and the released
ranks resume: nothing runs twice, and an item that cannot go back (its rank is gone)
is counted in the MigrationFailed raised.

With a StandbyPool (standby.py) the released ranks are parked instead of stopped:
their processes stay warm, and the component gets them back (`StandbyPool.join`,
then workload_resume) when its devices return, without a spawn.

The ranks are MigratableRanks (core/roles.py). A released rank stays open after its
export (it may get its items back) until workload_commit, sent once every kept rank
has imported. Items are WorkItems (records.py); a rollout rank's may offer their
requests' KV (components/rollout/worker.py), which the taker moves or leaves, per
request, and reports in its Taken.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.records import Taken, WorkItem
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.roles import MigratableRank
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.controller import Controller


@dataclass(slots=True)
class WorkloadResult:
    moved: int
    freed_devices: list[int]
    seconds: float
    taken: Taken = field(default_factory=lambda: Taken(0))
    """What the kept ranks took in: the moved requests' KV (tokens, loop seconds) and
    the requests prefilled again instead."""


def assign(weights: Sequence[float], loads: dict[int, float]) -> list[int]:
    """Pure: the kept position for each item. Heaviest first, each to the currently
    least loaded position (ties: lowest position), so the result is deterministic."""
    if not loads:
        raise ValueError("no kept ranks to hand work to")
    current = dict(loads)
    targets = [0] * len(weights)
    for i in sorted(range(len(weights)), key=lambda i: (-weights[i], i)):
        target = min(current, key=lambda p: (current[p], p))
        targets[i] = target
        current[target] += weights[i]
    return targets


async def workload_migrate(ctl: "Controller", group: WorkerGroup, release: Sequence[int],
                           park: StandbyPool | None = None) -> WorkloadResult:
    """Moves the work of the ranks at positions `release` to the others, then stops
    them (or parks them in `park`). On a failure anywhere, every exported item ends
    up running exactly once: on the kept rank that imported it, else back on the
    released rank it came from; an item that can go nowhere is counted in the
    MigrationFailed raised."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    release = sorted(set(release))
    keep = [p for p in range(group.world_size) if p not in release]
    if not release or not keep:
        raise ValueError("release some ranks, and keep at least one")
    exported: dict[int, list[WorkItem]] = {}
    """Released position -> the items its export returned (recorded as each returns)."""
    placed: set[int] = set()
    """Kept positions whose import took their share."""
    per_rank: dict[int, list[WorkItem]] = {p: [] for p in keep}
    try:
        # The kept ranks first: asking their load also holds them open for the import,
        # so none can finish and close between now and then. If none is open, the move
        # goes on only if the released ranks are done too (nothing to hand over);
        # otherwise nothing is touched: their work could go nowhere.
        loads = await group.on(keep).call(MigratableRank.workload_load)
        if all(load == float("inf") for load in loads):
            released = await group.on(release).call(MigratableRank.workload_load)
            if not all(load == float("inf") for load in released):
                raise MigrationFailed("no kept rank can take work")
        await group.on(release).call(MigratableRank.workload_pause)
        await export_each(group, release, exported)
        items = [item for p in release for item in exported[p]]
        targets = assign([item.weight for item in items], dict(zip(keep, loads)))
        for item, target in zip(items, targets):
            per_rank[target].append(item)
        taken = Taken(0)
        failed = await _import_each(group, [(p, per_rank[p]) for p in keep], taken)
        placed.update(p for p in keep if p not in failed)
        if failed:
            raise MigrationFailed(f"workload_import failed on positions {failed}")
        # The released ranks end their generation only now: until here a rollback could
        # still give their items back to them.
        await asyncio.gather(*(group.handles[p].call(MigratableRank.workload_commit) for p in release),
                             return_exceptions=True)
    except BaseException as exc:
        lost = await roll_back(group, keep, release, exported, placed, per_rank)
        if isinstance(exc, asyncio.CancelledError):
            raise
        note = f"; {lost} exported items could not be given back" if lost else ""
        cause = str(exc) if isinstance(exc, MigrationFailed) else repr(exc)
        raise MigrationFailed(f"workload migration of {group.name!r} rolled back: {cause}{note}") from exc
    freed = await (park.park(group, release) if park is not None else ctl.shrink_group(group, release))
    ctl.tracer.complete("workload migration", "migration", "migrations", 0, started, loop.time(),
                        {"group": group.name, "moved": len(items), "freed": freed})
    return WorkloadResult(len(items), freed, loop.time() - started, taken)


async def export_each(group: WorkerGroup, release: list[int], exported: dict[int, list[WorkItem]]) -> None:
    """workload_export on every released rank, recording each rank's items as they
    come; a failed export fails the migration with the others' items recorded, and a
    cancellation waits for the exports under way (their items must not vanish)."""
    calls = asyncio.gather(*(group.handles[p].call(MigratableRank.workload_export) for p in release),
                           return_exceptions=True)
    try:
        results = await asyncio.shield(calls)
    except asyncio.CancelledError:
        _record_exports(release, await calls, exported)
        raise
    failed = _record_exports(release, results, exported)
    if failed:
        raise MigrationFailed(f"workload_export failed on positions {failed}")


def _record_exports(release: list[int], results: list[Any], exported: dict[int, list[WorkItem]]) -> list[int]:
    failed = []
    for p, result in zip(release, results):
        if isinstance(result, BaseException):
            failed.append(p)
        else:
            exported[p] = list(result)
    return failed


async def roll_back(group: WorkerGroup, keep: list[int], release: list[int], exported: dict[int, list[WorkItem]],
                     placed: set[int], per_rank: dict[int, list[WorkItem]]) -> int:
    """Undoes a migration that failed: items a kept rank imported stay there; the rest
    go back to the released rank they came from; every held rank is let go; the
    released ranks resume. Returns how many items could go nowhere."""
    taken = {id(item) for p in placed for item in per_rank[p]}
    back = [(p, [item for item in exported.get(p, []) if id(item) not in taken]) for p in release]
    lost_positions = set(await _import_each(group, [(p, items) for p, items in back if items]))
    lost = sum(len(items) for p, items in back if p in lost_positions)
    # Then let go of every rank still held open for an import that will not come (a
    # released rank that got items back was let go by that import).
    given_back = {p for p, items in back if items}
    await _release_holds(group, [p for p in keep if p not in placed] + [p for p in release if p not in given_back])
    await asyncio.gather(*(group.handles[p].call(MigratableRank.workload_resume) for p in release),
                         return_exceptions=True)
    return lost


async def _import_each(group: WorkerGroup, parts: list[tuple[int, list[WorkItem]]], taken: Taken | None = None
                       ) -> list[int]:
    """workload_import(items) on each (rank position, items); returns the positions that
    failed (a rank that ended its generation, or is gone), adding what the others took
    to `taken`. Cancellation is raised."""
    results = await asyncio.gather(*(group.handles[p].call(MigratableRank.workload_import, items)
                                     for p, items in parts), return_exceptions=True)
    failed = []
    for (p, _), result in zip(parts, results):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            failed.append(p)
        elif taken is not None:
            taken.add(result)
    return failed


async def _release_holds(group: WorkerGroup, ranks: list[int]) -> None:
    """An empty import ends each rank's hold. A rank that fails even that is gone
    (WorkerLost), which its own watchers report; it holds nothing any more."""
    await _import_each(group, [(p, []) for p in ranks])
