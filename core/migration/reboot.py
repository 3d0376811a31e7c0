"""Reboot migration: the general fallback. Save what the component needs, stop
its workers, start them on the destination devices, restore. The costliest
strategy (processes restart), usable by any component, and the way to recover
one that hangs.

The saved state lives in the controller while no worker runs, so a failed
restart on the destination is retried on the original devices before giving up.

Worker protocol: reboot_state() -> plain data (tensors allowed), and
reboot_restore(states) with the list of every old rank's state (new ranks may
be more or fewer than old ones: the component decides how to split).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynarl.core.migration.p2p import MigrationFailed
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.controller import Controller


@dataclass(slots=True)
class RebootResult:
    group: WorkerGroup
    seconds: float
    restarted_on: list[int]


async def reboot_migrate(ctl: "Controller", group: WorkerGroup, devices: list[int],
                         init: dict[str, Any]) -> RebootResult:
    loop = asyncio.get_running_loop()
    started = loop.time()
    states = await group.call("reboot_state")
    original = list(group.devices)
    await ctl.stop_group(group)
    for attempt, target in enumerate((devices, original)):
        try:
            new = await ctl.spawn(group.cls, name=group.name, devices=target, init=init)
            await new.call("reboot_restore", states)
        except Exception as exc:
            if group.name in ctl.groups:  # spawned but not restored: it must not linger
                await ctl.stop_group(ctl.groups[group.name])
            if attempt == 1:
                failure = MigrationFailed(f"reboot of {group.name!r} failed on {devices} and on {original}: "
                                          f"{exc!r}")
                failure.saved_state = states  # nothing lost: the caller may restart it elsewhere
                raise failure from exc
            continue
        ctl.tracer.complete("reboot migration", "migration", "migrations", 0, started, loop.time(),
                            {"group": group.name, "devices": target})
        return RebootResult(new, loop.time() - started, list(target))
    raise AssertionError("unreachable")
