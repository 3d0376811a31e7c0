"""The fixed spatial split: devices in proportion to each component's work.

Rule: component c gets a share of the N devices proportional to W_c, its work in
device-seconds at full-batch efficiency (the work term of the lower bound), rounded
to its granularity (rollout: whole engines of TP devices) by largest remainder,
with at least one unit each. If every stage scaled linearly, all three would take
W_total / N: the balanced pipeline. Rollout's long tail does not scale, which is
exactly the static split's weakness that dynamic policies address.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from dynarl.components.placement.plan import COMPONENTS


def proportional_split(work: Mapping[str, float], num_devices: int,
                       granularity: Mapping[str, int] | None = None,
                       components: Sequence[str] = COMPONENTS) -> dict[str, int]:
    """`components`: the names split over (default the LLM workflows' three)."""
    names = tuple(components)
    unit = {c: (granularity or {}).get(c, 1) for c in names}
    for c in names:
        if work.get(c, 0.0) < 0:
            raise ValueError(f"work of {c} must be >= 0, got {work[c]}")
        if unit[c] < 1:
            raise ValueError(f"granularity of {c} must be >= 1, got {unit[c]}")
    if num_devices < sum(unit.values()):
        raise ValueError(f"{num_devices} devices cannot hold one unit of each component ({unit})")
    total = sum(work.get(c, 0.0) for c in names)
    shares = {c: (work.get(c, 0.0) / total if total > 0 else 1 / len(names)) * num_devices for c in names}
    units = {c: max(1, int(shares[c] // unit[c])) for c in names}
    left = num_devices - sum(units[c] * unit[c] for c in names)
    while left < 0:  # the minimum of one unit each overshot: take from the largest
        c = max(names, key=lambda c: (units[c] * unit[c], c))
        if units[c] == 1:
            raise ValueError(f"{num_devices} devices cannot hold one unit of each component ({unit})")
        units[c] -= 1
        left += unit[c]
    # largest remainder first, one unit each per round; a unit that does not fit is skipped
    order = sorted(names, key=lambda c: (-(shares[c] - units[c] * unit[c]) / unit[c], names.index(c)))
    while left > 0:
        fitting = [c for c in order if unit[c] <= left]
        if not fitting:
            raise ValueError(f"cannot split {num_devices} devices into units {unit}")
        for c in fitting:
            if unit[c] <= left:
                units[c] += 1
                left -= unit[c]
    return {c: units[c] * unit[c] for c in names}
