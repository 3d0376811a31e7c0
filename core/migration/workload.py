"""Workload migration (rollout, inference, reward, tool): move the work, not the
state. The released ranks pause at a step boundary and export their pending and
in-flight requests (prompt, tokens so far, sampling state); the kept ranks import
and continue them; then the released ranks stop and free their devices.

If handing the work over fails (or pausing or exporting does), the kept ranks are
let go of the import they were held open for, the exported items go back to the
released ranks, which resume: nothing runs twice, and an item that cannot go back
(its rank is gone) is counted in the MigrationFailed raised.

With a StandbyPool (standby.py) the released ranks are parked instead of stopped:
their processes stay warm, and the component gets them back (`StandbyPool.join`,
then workload_resume) when its devices return, without a spawn.

Worker protocol: workload_pause(), workload_export() -> [item], workload_load()
-> float, workload_import([item]), workload_resume(). Each item is a dict with
at least "id" and "weight" (its expected remaining work, for balancing).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.controller import Controller


@dataclass(slots=True)
class WorkloadResult:
    moved: int
    freed_devices: list[int]
    seconds: float


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
    them (or parks them in `park`)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    release = sorted(set(release))
    keep = [p for p in range(group.world_size) if p not in release]
    if not release or not keep:
        raise ValueError("release some ranks, and keep at least one")
    # The kept ranks first: asking their load also holds them open for the import,
    # so none can finish and close between now and then. If none is open, the move
    # goes on only if the released ranks are done too (nothing to hand over);
    # otherwise nothing is touched: their work could go nowhere, and not back either.
    loads = await group.call("workload_load", ranks=keep)
    exported: list[list[dict]] = []
    try:
        if all(load == float("inf") for load in loads):
            released = await group.call("workload_load", ranks=release)
            if not all(load == float("inf") for load in released):
                raise MigrationFailed(f"workload migration of {group.name!r}: no kept rank can take work")
        await group.call("workload_pause", ranks=release)
        exported = await group.call("workload_export", ranks=release)
        items = [item for part in exported for item in part]
        targets = assign([float(item["weight"]) for item in items], dict(zip(keep, loads)))
        per_rank = {p: [] for p in keep}
        for item, target in zip(items, targets):
            per_rank[target].append(item)
        await group.scatter("workload_import", [[per_rank[p]] for p in keep], ranks=keep)
    except BaseException as exc:
        # First let the kept ranks go (held open for an import that will not come: they
        # would never finish), then give every exported item back to the rank it came
        # from and let the released ranks go on.
        await _release_holds(group, keep + release)
        lost = await _give_back(group, release, exported)
        await asyncio.gather(*(group.handles[p].call("workload_resume") for p in release), return_exceptions=True)
        if isinstance(exc, (asyncio.CancelledError, MigrationFailed)):
            raise
        note = f"; {lost} exported items could not be given back" if lost else ""
        raise MigrationFailed(f"workload migration of {group.name!r} rolled back: {exc!r}{note}") from exc
    freed = await (park.park(group, release) if park is not None else ctl.shrink_group(group, release))
    ctl.tracer.complete("workload migration", "migration", "migrations", 0, started, loop.time(),
                        {"group": group.name, "moved": len(items), "freed": freed})
    return WorkloadResult(len(items), freed, loop.time() - started)


async def _import_each(group: WorkerGroup, parts: list[tuple[int, list[dict]]]) -> list[int]:
    """workload_import(items) on each (rank position, items); returns the positions that
    failed (a rank that ended its generation, or is gone). Cancellation is raised."""
    results = await asyncio.gather(*(group.handles[p].call("workload_import", [items]) for p, items in parts),
                                   return_exceptions=True)
    failed = []
    for (p, _), result in zip(parts, results):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            failed.append(p)
    return failed


async def _release_holds(group: WorkerGroup, ranks: list[int]) -> None:
    """An empty import ends each rank's hold. A rank that fails even that is gone
    (WorkerLost), which its own watchers report; it holds nothing any more."""
    await _import_each(group, [(p, []) for p in ranks])


async def _give_back(group: WorkerGroup, release: list[int], exported: list[list[dict]]) -> int:
    """Re-imports each released rank's exported items into it; returns how many items
    could not be given back."""
    parts = [(p, part) for p, part in zip(release, exported) if part]
    failed = set(await _import_each(group, parts))
    return sum(len(part) for p, part in parts if p in failed)
