"""torch.distributed's default (world) group for a trainer rank.

dynarl's runtime builds its groups directly (transport/process_group.py) and never
calls init_process_group, but megatron-core's parallel state and torch's DeviceMesh
(FSDP2, DTensor) read the default group. A trainer makes its data-parallel group the
world: same members and ranks, keys under their own prefix in that group's store
(a one-rank world on a HashStore when it trains alone). The world mirrors one trainer
group at a time; a trainer built over another group (a standby adopted by a P2P
reshard, a trainer at another DP size) replaces it. `leave_default_group` is the
trainer's close.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

_mirrored: list[Any] = []
"""The trainer group the current default group mirrors (None: a one-rank world)."""


def init_default_group(group: Any, replace: bool = True) -> None:
    """Makes the default group mirror `group` (None: a one-rank world), unless it already
    does. `replace` False: any default group stays (megatron's parallel state holds groups
    built from it, which replacing it would destroy under megatron; its close leaves)."""
    if dist.is_initialized():
        if (_mirrored and _mirrored[0] is group) or not replace:
            return
        leave_default_group()
    store: dist.Store
    if group is None:
        store, rank, size = dist.HashStore(), 0, 1
    else:
        _, group_store = dist.distributed_c10d._world.pg_map[group]
        store, rank, size = dist.PrefixStore("trainer-world/", group_store), group.rank(), group.size()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", store=store, rank=rank,
                            world_size=size)
    _mirrored[:] = [group]


def leave_default_group() -> None:
    """Destroys the default group. Destroying it makes torch forget every group it
    knows of; dynarl's own (registered without a name) are put back for their members."""
    _mirrored.clear()
    if not dist.is_initialized():
        return
    world = dist.distributed_c10d._world
    own = {pg: (world.pg_map[pg], world.pg_group_ranks.get(pg)) for pg in list(world.pg_map)
           if pg not in world.pg_names}
    dist.destroy_process_group()
    for pg, (entry, ranks) in own.items():
        world.pg_map[pg] = entry
        if ranks is not None:
            world.pg_group_ranks[pg] = ranks
