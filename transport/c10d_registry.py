"""c10d's record of the groups it knows: a group built directly (not by `new_group`)
is registered here as `new_group` does, so the standard calls (`dist.send`,
`dist.broadcast`, ...) take it with group-relative ranks."""
from __future__ import annotations

from typing import Any


def register(group: Any, size: int, backend: str, store: Any) -> None:
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    c10d._world.pg_group_ranks[group] = {r: r for r in range(size)}
    c10d._world.pg_map[group] = (backend, store)


def unregister(group: Any) -> None:
    import torch.distributed as dist
    c10d = dist.distributed_c10d
    c10d._world.pg_group_ranks.pop(group, None)
    c10d._world.pg_map.pop(group, None)
