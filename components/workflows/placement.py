"""Placement: which devices each component of a workflow runs on.

A pure function of the mode, the device count and each component's rank count,
tested with tables. Components are grouped into *pools*; a pool gets its own
contiguous block of devices and the components in it time-share that block
through device_lock (onload on acquire, offload on release):

    temporal   one pool with every component:     [[rollout, inference, trainer]]
    spatial    one pool per component:              [[rollout], [inference], [trainer]]
    hybrid     the pools you choose, by default:    [[rollout], [inference, trainer]]

A pool's block is as wide as its widest component; each component takes the first
`ranks` devices of its block. Components on disjoint blocks run concurrently, which
is what lets inference start on finished groups while rollout is still generating.
"""
from __future__ import annotations

from typing import Literal, Mapping, Sequence

Mode = Literal["temporal", "spatial", "hybrid"]
COMPONENTS = ("rollout", "inference", "trainer")
"""Components that hold devices, in data-dependency order (the device_lock order)."""
DEFAULT_HYBRID_POOLS: tuple[tuple[str, ...], ...] = (("rollout",), ("inference", "trainer"))


class PlacementError(ValueError):
    """The requested placement does not fit the cluster."""


def pools_for(mode: Mode, hybrid_pools: Sequence[Sequence[str]] | None = None) -> list[list[str]]:
    """The pools of `mode`; `hybrid_pools` only applies to hybrid."""
    if mode == "temporal":
        return [list(COMPONENTS)]
    if mode == "spatial":
        return [[c] for c in COMPONENTS]
    if mode != "hybrid":
        raise PlacementError(f"unknown placement mode {mode!r}; choose from 'temporal', 'spatial', 'hybrid'")
    pools = [list(p) for p in (hybrid_pools or DEFAULT_HYBRID_POOLS)]
    seen = [c for pool in pools for c in pool]
    unknown = sorted(set(seen) - set(COMPONENTS))
    if unknown:
        raise PlacementError(f"unknown component(s) {unknown} in pools; components are {', '.join(COMPONENTS)}")
    if any(not pool for pool in pools):
        raise PlacementError("a pool must name at least one component")
    twice = sorted({c for c in seen if seen.count(c) > 1})
    if twice:
        raise PlacementError(f"component(s) {twice} appear in more than one pool")
    missing = [c for c in COMPONENTS if c not in seen]
    if missing:
        raise PlacementError(f"component(s) {missing} are in no pool; every one of {', '.join(COMPONENTS)} needs one")
    return pools


def plan_placement(mode: Mode, num_devices: int, ranks: Mapping[str, int],
                   hybrid_pools: Sequence[Sequence[str]] | None = None) -> dict[str, list[int]]:
    """Device id of each rank of each component."""
    for c in COMPONENTS:
        if ranks.get(c, 0) < 1:
            raise PlacementError(f"{c} needs at least one rank, got {ranks.get(c, 0)}")
    pools = pools_for(mode, hybrid_pools)
    widths = [max(ranks[c] for c in pool) for pool in pools]
    needed = sum(widths)
    if needed > num_devices:
        shape = " + ".join(f"{w} ({'/'.join(pool)})" for w, pool in zip(widths, pools))
        raise PlacementError(f"{mode} placement needs {shape} = {needed} devices but the cluster has {num_devices}")
    plan: dict[str, list[int]] = {}
    start = 0
    for width, pool in zip(widths, pools):
        for c in pool:
            plan[c] = list(range(start, start + ranks[c]))
        start += width
    return {c: plan[c] for c in COMPONENTS}


def shared_devices(plan: Mapping[str, Sequence[int]]) -> dict[int, list[str]]:
    """Device id -> the components that time-share it (only devices with two or more)."""
    users: dict[int, list[str]] = {}
    for c, devices in plan.items():
        for d in devices:
            users.setdefault(d, []).append(c)
    return {d: cs for d, cs in sorted(users.items()) if len(cs) > 1}
