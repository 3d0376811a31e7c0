"""Higher tensor parallelism for the rollout's tail (scheduler.dynarl.tail_tp; the
dynarl-tailtp policy of `dynarl sim`).

Once the rollout is a donor, the engines it keeps are in the long tail: few requests
each, decode-bound, each step reading the whole weight shard. Merging two kept TP-t
engines of one node into one TP-2t engine halves the weight bytes every device reads
per step (the cost model's decode step, at the new TP), so the stragglers make tokens
faster. It is a reboot of those engines, paid in full:

    pause, export every unfinished group (or turn) with its requests' tokens so far
    (the Workload migration protocol), stop both engines; an engine restart on their
    devices (MoveCosts.restart_s on emulated devices); the new engine loads the
    current weights from the trainer (the step's Joins: `ready_ranks`); it joins the
    running step (`stage_call`: generate() for GRPO, serve_turns for
    the agentic workflow, whose driver routes to it from then on), imports the work
    and re-prefills its tokens (in its own emulation).

A pause or export that fails rolls back (each engine gets its own groups back and
resumes at the base TP; MigrationFailed, which the Mover lets pass). On an
agentic workload the episode driver was told before the pause that the pair leaves
(as for any Workload release): after a rollback the two engines finish the turns
they hold and end, and the other engines take the episodes' next turns. After the
commit the old engines are gone and a failure ends the run.

The devices stay the rollout's throughout (no ownership change). Emulated devices
charge the restart (MoveCosts.restart_s); real engines take the time it takes. Pairs are formed
within a node (TP spans one NVLink domain), each of an engine with requests and an
idle one the donor keeps (widen_pairs), so the requests get twice the devices. At the
iteration boundary the Mover stops the wide engines and starts base-TP engines
again (mover.py: Mover.restore).
"""
from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping, NamedTuple, Sequence

from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.migration.records import Taken
from dynarl.core.migration.step import Joins, Step
from dynarl.core.migration.workload import export_each, roll_back
from dynarl.core.roles import MigratableRank, ReportingRank

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_group import WorkerGroup

WIDEN = 2
"""Engines merged into one: TP-t engines become TP-(WIDEN*t) engines."""
POLL_S = 0.01
"""Emulated seconds between checks that a started engine's generation is open."""


class Engine(NamedTuple):
    position: int
    node: int
    device: int
    """Its first device."""
    active: bool
    """Its generation still runs this step. An agentic engine serves turns until the
    step's episodes are over, so on agentic workloads no kept engine is idle and no
    pair forms. (Pairing by turns held instead made agentic runs depend on the worker
    ids' random tags: not deterministic, cause not found yet.)"""


def widen_pairs(engines: Sequence[Engine]) -> list[tuple[int, int]]:
    """Pure: the positions to merge, pairwise: per node, in device order, each engine with
    requests beside an idle one the donor still keeps (its requests get twice the devices).
    Two engines with requests are not merged: both would stall for the restart while
    their batches are still large (measured: 460 s against dynarl's 396.5 s on math-7b x
    64, docs/benchmarks.md), and two idle ones have nothing to speed up."""
    pairs: list[tuple[int, int]] = []
    for node in sorted({e.node for e in engines}):
        here = sorted((e for e in engines if e.node == node), key=lambda e: e.device)
        active = [e.position for e in here if e.active]
        idle = [e.position for e in here if not e.active]
        pairs.extend((min(a, b), max(a, b)) for a, b in zip(active, idle))
    return pairs


async def widen(ctl: "Controller", joins: Joins, group: "WorkerGroup", name: str, tp: int,
                wide: Mapping[int, Sequence[int]], live: Step, widened: Callable[[dict[int, tuple[int, ...]]], None],
                restart: Callable[[], Awaitable[None]], time_scale: float) -> tuple[float, Taken] | None:
    """Merges pairs of the rollout's base-TP engines (widen_pairs; those whose first
    device is in `wide` are wide already) into engines of WIDEN times the TP; tells
    `widened` their devices once they started; `restart` charges the engine restart.
    Returns when it began and what the wide engines took in (None: no pair)."""
    loads = await group.call(ReportingRank.metrics)
    handles = list(group.handles)
    engines = [Engine(p, ctl.pool.devices[h.spec.devices[0]].node, h.spec.devices[0], loads[p].active_run)
               for p, h in enumerate(handles) if h.spec.devices[0] not in wide]
    pairs = widen_pairs(engines)
    if not pairs or not live.accepts(name):
        return None
    loop = asyncio.get_running_loop()
    begun = loop.time()
    # Registered before anything moves, so the rollout is not done while its work is in between.
    slots = [loop.create_future() for _ in pairs]
    live.extras[name].extend(slots)
    release = sorted(p for pair in pairs for p in pair)
    exported: dict[int, list[Any]] = {}
    # the agentic driver routes no more turns to them
    await joins.releasing(name, [handles[p].spec.worker_id for p in release])
    try:
        await group.on(release).call(MigratableRank.workload_pause)
        await export_each(group, release, exported)
    except BaseException as exc:
        # Nothing has moved yet: every engine gets its own work back and resumes, and
        # the step goes on at the base TP.
        lost = await roll_back(group, [], release, exported, set(), {})
        for slot in slots:
            if not slot.done():
                slot.set_result(None)
        if not isinstance(exc, Exception):
            raise
        note = f"; {lost} exported items could not be given back" if lost else ""
        raise MigrationFailed(f"tail-TP widening rolled back: {exc}{note}") from exc
    try:
        await group.on(release).call(MigratableRank.workload_commit)  # their runs end: the wider engines take over
        firsts = [handles[a].spec.devices[0] for a, _ in pairs]
        members = {f: tuple(sorted(handles[p].spec.devices[0] + k for p in pair for k in range(tp)))
                   for f, pair in zip(firsts, pairs)}
        await ctl.shrink_group(group, release)
        await restart()  # offload, restart at the new TP, onload
        first = group.world_size
        await ctl.grow_group(group, firsts, joins.rank_init(name, tp=WIDEN * tp))
        new = list(range(first, group.world_size))
        await joins.ready_ranks(name, group, new, live.version)
        widened(members)
        for p, slot in zip(new, slots):
            call = asyncio.ensure_future(joins.stage_call(name, p, live.version))
            call.add_done_callback(functools.partial(_settle, slot))
        await _opened(group, new, time_scale)
        taken = Taken(0)
        for result in await group.on(new).scatter(MigratableRank.workload_import,
                                                  [[exported[a] + exported[b]] for a, b in pairs]):
            taken.add(result)
        await joins.joined(name, [group.handles[p].spec.worker_id for p in new])
    except BaseException as exc:
        for slot in slots:
            if not slot.done():
                slot.set_exception(exc) if isinstance(exc, Exception) else slot.cancel()
        raise
    return begun, taken


async def _opened(group: "WorkerGroup", ranks: list[int], time_scale: float) -> None:
    """Waits until each new engine's generation is open (it can take imports)."""
    for _ in range(10_000):
        loads = await group.on(ranks).call(MigratableRank.workload_load)
        if all(load != float("inf") for load in loads):
            return
        await asyncio.sleep(POLL_S * time_scale)
    raise RuntimeError("a wide rollout engine's generation did not start")


def _settle(slot: asyncio.Future, call: asyncio.Future) -> None:
    if slot.done():
        return
    if call.cancelled():
        slot.cancel()
    elif (exc := call.exception()) is not None:
        slot.set_exception(exc)
    else:
        slot.set_result(call.result())
