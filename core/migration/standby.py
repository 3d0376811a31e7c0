"""Warm standby ranks: processes of one worker class, started once, parked on
devices until a migration needs a rank there.

Spawning a worker process costs seconds (interpreter, torch import, model build),
far more than a rollout's long tail lasts; so a component that may receive devices
keeps idle ranks of its class on them. A P2P migration adopts standbys for its
new ranks instead of spawning (create-before-destroy is unchanged: they join the
new DP group, receive the state, confirm, and only then is the switch made) and
parks the old ranks here afterwards instead of stopping them; a Workload donor
parks its released engines here, and gets them back when its devices return.

Ranks move between WorkerGroups without restarting: the handles change group, the
controller's device accounting follows. Parked ranks belong to the pool's own
group (`<name>~standby`), so controller shutdown reaps them with everything else.
A rank that a failed migration leaves behind is stopped, not parked: it may be
broken, and the pool spawns a fresh one the next time it is filled.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_handle import WorkerHandle


class StandbyPool:
    def __init__(self, ctl: "Controller", cls: type, name: str, init: dict[str, Any],
                 warm: Callable[..., Any] | None = None) -> None:
        self.ctl = ctl
        self.cls = cls
        self.init = init
        self.warm = warm
        """A method (a reference) every new standby runs once after it starts (imports,
        first allocations), so that its first adoption costs what later ones do."""
        self.name = f"{name}~standby"
        self.home = name
        """The group its ranks stand in for (they run with its torch threads)."""
        self.group: WorkerGroup | None = None

    def devices(self) -> list[int]:
        """One entry per parked rank (a device may hold several)."""
        return [] if self.group is None else list(self.group.devices)

    def has(self, devices: Sequence[int]) -> bool:
        """A parked rank for every entry of `devices` (repeats need as many ranks)."""
        return not self._missing(devices)

    def _missing(self, devices: Sequence[int]) -> list[int]:
        """The entries of `devices` no parked rank is left for (repeats count)."""
        parked, missing = self.devices(), []
        for d in devices:
            if d in parked:
                parked.remove(d)
            else:
                missing.append(d)
        return missing

    def _chosen(self, devices: Sequence[int]) -> list["WorkerHandle"]:
        """One parked rank per entry of `devices`, in that order."""
        if not self.has(devices):
            raise LookupError(f"{self.name}: no parked rank for every device of {list(devices)}")
        chosen: list[WorkerHandle] = []
        assert self.group is not None
        for d in devices:
            chosen.append(next(h for h in self.group.handles if h.spec.devices[0] == d and h not in chosen))
        return chosen

    async def fill(self, devices: Sequence[int]) -> None:
        """Starts standbys so that at least the listed ranks are parked (repeats count)."""
        missing = self._missing(devices)
        if not missing:
            return
        if self.group is None or self.group.stopped:
            home = self.ctl.groups.get(self.home)
            self.group = await self.ctl.spawn(self.cls, name=self.name, devices=missing, init=self.init,
                                              threads=home.threads if home else None)
            new = list(range(self.group.world_size))
        else:
            await self.ctl.grow_group(self.group, missing, self.init)
            new = list(range(self.group.world_size - len(missing), self.group.world_size))
        if self.warm is not None:
            await self.group.on(new).call(self.warm)

    def adopt(self, devices: Sequence[int], name: str) -> WorkerGroup:
        """A new group `name` of parked ranks, one per entry of `devices`, in that order."""
        chosen = self._chosen(devices)
        assert self.group is not None
        if name in self.ctl.groups:
            raise ValueError(f"a group named {name!r} already exists")
        group = WorkerGroup(self.ctl, name, self.cls, [], self.group.threads)
        self.ctl.groups[name] = group
        self.ctl.pool.place(name, None, [h.spec.devices[0] for h in chosen])
        _move(self.ctl, chosen, self.group, group, placed=True)
        return group

    def join(self, group: WorkerGroup, devices: Sequence[int]) -> None:
        """Parked ranks on `devices` rejoin `group` (a donor getting its devices back)."""
        chosen = self._chosen(devices)
        assert self.group is not None
        _move(self.ctl, chosen, self.group, group)

    async def park(self, group: WorkerGroup, positions: Sequence[int] | None = None) -> list[int]:
        """Moves the ranks at `positions` (default: all, which retires the group) out
        of `group` into the pool. Returns the devices they held."""
        chosen = [group.handles[p] for p in sorted(set(positions if positions is not None
                                                       else range(group.world_size)))]
        if self.group is None or self.group.stopped:
            self.group = WorkerGroup(self.ctl, self.name, self.cls, [], group.threads)
            self.ctl.groups[self.name] = self.group
        _move(self.ctl, chosen, group, self.group)
        if not group.handles:  # the whole group parked: it is gone as a group
            group.stopped = True
            self.ctl.groups.pop(group.name, None)
            self.ctl.pool.release(group.name)
            self.ctl.graph.observe_stop(group.name)
        return [d for h in chosen for d in h.spec.devices]


def _move(ctl: "Controller", handles: list["WorkerHandle"], src: WorkerGroup, dst: WorkerGroup,
          placed: bool = False) -> None:
    """Hands live ranks from `src` to `dst`: membership and the device accounting."""
    devices = [d for h in handles for d in h.spec.devices]
    src.handles = [h for h in src.handles if h not in handles]
    ctl.pool.shrink(src.name, devices)
    dst.handles.extend(handles)
    if not placed:
        ctl.pool.extend(dst.name, devices)
    for g in (src, dst):
        ctl.graph.observe_spawn(g.name, g.cls.__name__, [h.spec.worker_id for h in g.handles], g.devices)
