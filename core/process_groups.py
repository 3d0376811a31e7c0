"""Controller-side orchestration of runtime torch.distributed groups.

The first member hosts the group's TCPStore on a free port; then every member
joins concurrently (the rendezvous needs all of them). Rebuilding a group with a
different member set bumps its generation, so the new group's store keys never
collide with the old one's; members that drop out leave first.
"""
from __future__ import annotations

import asyncio
import secrets
from typing import TYPE_CHECKING, Sequence

from dynarl.core.worker_group import WorkerGroup, gather_or_cancel
from dynarl.core.worker_handle import WorkerHandle

if TYPE_CHECKING:
    from dynarl.core.controller import Controller

_DEFAULT_BACKEND = {"cuda": "nccl", "cpu": "gloo", "emulated": "emulated"}
"""The collective backend of each device kind (emulated: membership records only)."""


class RuntimeProcessGroup:
    def __init__(self, manager: "ProcessGroups", name: str, members: list[WorkerHandle],
                 generation: int, backend: str, store: tuple[str, int] | None = None) -> None:
        self._manager = manager
        self.name = name
        self.members = members
        self.generation = generation
        self.backend = backend
        self.store = store
        """(host, port) of the TCPStore its first member hosts (None: emulated)."""

    @property
    def size(self) -> int:
        return len(self.members)

    async def destroy(self) -> None:
        await self._manager.destroy(self.name)

    def __repr__(self) -> str:
        return f"RuntimeProcessGroup({self.name!r}, gen={self.generation}, members={[h.name for h in self.members]})"


class ProcessGroups:
    def __init__(self, ctl: "Controller") -> None:
        self._ctl = ctl
        self.active: dict[str, RuntimeProcessGroup] = {}
        self._generations: dict[str, int] = {}

    async def create(self, name: str, members: Sequence[WorkerGroup | tuple[WorkerGroup, int]], *,
                     backend: str | None, timeout_s: float) -> RuntimeProcessGroup:
        handles = _expand(members)
        if not handles:
            raise ValueError("a process group needs at least one member")
        if len(set(map(id, handles))) != len(handles):
            raise ValueError("a rank appears twice in the member list")
        backend = backend or _DEFAULT_BACKEND[self._ctl.config.cluster.device_kind]
        loop = asyncio.get_running_loop()
        started = loop.time()
        if name in self.active:
            await self.destroy(name)
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        node_address = self._ctl.launcher.node_address
        host = node_address(handles[0].spec.node)
        port = 0 if backend == "emulated" else await handles[0].send("__pg_listen__", [name, host])
        # Each rank's own node address (the one its peers reach gloo's pairs at), and the
        # group's key prefix, fresh per build: the members seal the store's names and
        # values under a key of the job secret and this prefix (transport/sealed_store.py),
        # as a TCPStore takes any client that reaches its port (another user of the host too).
        prefix = f"dynarl/{name}/{generation}/{secrets.token_hex(16)}"
        # Each member's device: where two share one, the group hands over locally within
        # a device and runs collectives only between devices (transport/device_group.py).
        devices = [h.spec.devices[0] if h.spec.devices else None for h in handles]
        await gather_or_cancel([
            h.send("__pg_join__", [name, prefix, rank, len(handles), host, port, backend, timeout_s,
                                   node_address(h.spec.node), devices])
            for rank, h in enumerate(handles)])
        group = self.active[name] = RuntimeProcessGroup(self, name, handles, generation, backend,
                                                               None if backend == "emulated" else (host, port))
        self._ctl.tracer.complete(f"pg {name}", "lifecycle", "process_groups", 0, started, loop.time(),
                                  {"generation": generation, "members": [h.name for h in handles]})
        return group

    async def destroy(self, name: str) -> None:
        group = self.active.pop(name, None)
        if group is None:
            return
        live = [h for h in group.members if h.alive]
        await asyncio.gather(*(h.send("__pg_leave__", [name]) for h in live), return_exceptions=True)
        self._ctl.tracer.instant(f"pg {name} destroyed", "lifecycle", "process_groups",
                                 asyncio.get_running_loop().time())


def _expand(members: Sequence[WorkerGroup | tuple[WorkerGroup, int]]) -> list[WorkerHandle]:
    handles: list[WorkerHandle] = []
    for member in members:
        if isinstance(member, WorkerGroup):
            handles.extend(member.handles)
        else:
            group, rank = member
            handles.append(group.handles[rank])
    return handles
