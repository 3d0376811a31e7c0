"""Placement: the workflow chain cut into segments, each on a block of devices.
The one placement model of both `dynarl train` and `dynarl sim`.

Components within one segment time-share the segment's devices (colocated:
device_lock, one after the other); segments run concurrently and stream data
to each other through channels (spatial). So:

    colocated  [rollout, inference, trainer] : N
    spatial    [rollout] : a | [inference] : b | [trainer] : c
    hybrid     e.g. [rollout] : a | [inference, trainer] : N - a

Segments keep the chain order and take contiguous device blocks in that order. A
component's ranks take the first devices of its segment, `unit` devices each (a
rollout engine at TP 2 covers two); by default as many ranks as the segment holds.
Constructors: `colocated`, `spatial` (device counts), `from_pools` (the modes of
`dynarl train`: pools of components and rank counts), and the RLinf planner's plans
(planner.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

COMPONENTS = ("rollout", "inference", "trainer")
"""The GRPO chain, in data-dependency order (also the device_lock order)."""
Mode = Literal["colocated", "spatial", "hybrid"]
DEFAULT_HYBRID_POOLS: tuple[tuple[str, ...], ...] = (("rollout",), ("inference", "trainer"))


class PlacementError(ValueError):
    """The requested placement does not fit the cluster."""


@dataclass(frozen=True, slots=True)
class Segment:
    components: tuple[str, ...]
    devices: int


@dataclass(frozen=True, slots=True)
class Placement:
    segments: tuple[Segment, ...]
    ranks: tuple[tuple[str, int], ...] = ()
    """(component, ranks) where not every rank the segment holds is used."""
    unit: tuple[tuple[str, int], ...] = field(default=())
    """(component, devices per rank) where it is not 1 (rollout TP)."""

    def __post_init__(self) -> None:
        order = [c for s in self.segments for c in s.components]
        if tuple(order) != COMPONENTS:
            raise ValueError(f"segments must cover {', '.join(COMPONENTS)} once each, in that order; got {order}")
        for s in self.segments:
            if s.devices < 1:
                raise ValueError(f"segment {'+'.join(s.components)} has {s.devices} devices")
        for c in COMPONENTS:
            if not 1 <= self.num_ranks(c) * self.unit_of(c) <= self.num_devices_of(c):
                raise PlacementError(f"{c}: {self.num_ranks(c)} ranks of {self.unit_of(c)} devices do not fit "
                                     f"its segment of {self.num_devices_of(c)}")

    @property
    def num_devices(self) -> int:
        return sum(s.devices for s in self.segments)

    @property
    def mode(self) -> Mode:
        if len(self.segments) == 1:
            return "colocated"
        if all(len(s.components) == 1 for s in self.segments):
            return "spatial"
        return "hybrid"

    def segment_of(self, component: str) -> tuple[int, Segment]:
        for i, s in enumerate(self.segments):
            if component in s.components:
                return i, s
        raise KeyError(f"unknown component {component!r}; components are {', '.join(COMPONENTS)}")

    def num_devices_of(self, component: str) -> int:
        return self.segment_of(component)[1].devices

    def unit_of(self, component: str) -> int:
        return dict(self.unit).get(component, 1)

    def num_ranks(self, component: str) -> int:
        return dict(self.ranks).get(component, self.num_devices_of(component) // self.unit_of(component))

    def device_ids(self, component: str) -> list[int]:
        """Every device of the component's segment."""
        index, segment = self.segment_of(component)
        start = sum(s.devices for s in self.segments[:index])
        return list(range(start, start + segment.devices))

    def rank_devices(self, component: str) -> list[int]:
        """The first device of each of the component's ranks."""
        unit = self.unit_of(component)
        return self.device_ids(component)[:self.num_ranks(component) * unit:unit]

    def shares_devices(self, component: str) -> bool:
        return len(self.segment_of(component)[1].components) > 1

    def describe(self) -> str:
        return " | ".join(f"{'+'.join(s.components)}:{s.devices}" for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "segments": self.describe(),
                "devices": {c: self.num_devices_of(c) for c in COMPONENTS}}


def colocated(num_devices: int, unit: Mapping[str, int] | None = None) -> Placement:
    return Placement((Segment(COMPONENTS, num_devices),), unit=_pairs(unit))


def spatial(counts: Mapping[str, int], unit: Mapping[str, int] | None = None) -> Placement:
    return Placement(tuple(Segment((c,), counts[c]) for c in COMPONENTS), unit=_pairs(unit))


def hybrid(rollout_devices: int, num_devices: int, unit: Mapping[str, int] | None = None) -> Placement:
    """RLinf's hybrid mode as DEFAULT_HYBRID_POOLS: rollout on devices of its own,
    inference and trainer time-sharing the rest."""
    return Placement((Segment(("rollout",), rollout_devices), Segment(("inference", "trainer"),
                                                                      num_devices - rollout_devices)),
                     unit=_pairs(unit))


def with_unit(placement: Placement, unit: Mapping[str, int]) -> Placement:
    """The same segments with `unit` devices per rank (a planner's plan at rollout TP)."""
    return Placement(placement.segments, placement.ranks, _pairs(unit))


def pools_for(mode: Mode, hybrid_pools: Sequence[Sequence[str]] | None = None) -> list[list[str]]:
    """The pools of `mode` in chain order; `hybrid_pools` only applies to hybrid."""
    if mode == "colocated":
        return [list(COMPONENTS)]
    if mode == "spatial":
        return [[c] for c in COMPONENTS]
    if mode != "hybrid":
        raise PlacementError(f"unknown placement mode {mode!r}; choose from 'colocated', 'spatial', 'hybrid'")
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
    order = {c: i for i, c in enumerate(COMPONENTS)}
    return sorted(([c for c in COMPONENTS if c in pool] for pool in pools), key=lambda p: order[p[0]])


def from_pools(mode: Mode, num_devices: int, ranks: Mapping[str, int],
               hybrid_pools: Sequence[Sequence[str]] | None = None) -> Placement:
    """`dynarl train`'s placement: one segment per pool, as wide as its widest
    component; each component's ranks on the first devices of its segment."""
    for c in COMPONENTS:
        if ranks.get(c, 0) < 1:
            raise PlacementError(f"{c} needs at least one rank, got {ranks.get(c, 0)}")
    pools = pools_for(mode, hybrid_pools)
    widths = [max(ranks[c] for c in pool) for pool in pools]
    needed = sum(widths)
    if needed > num_devices:
        shape = " + ".join(f"{w} ({'/'.join(pool)})" for w, pool in zip(widths, pools))
        raise PlacementError(f"{mode} placement needs {shape} = {needed} devices but the cluster has {num_devices}")
    segments = tuple(Segment(tuple(pool), width) for pool, width in zip(pools, widths))
    return Placement(segments, ranks=tuple((c, ranks[c]) for c in COMPONENTS))


def _pairs(mapping: Mapping[str, int] | None) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((c, n) for c, n in (mapping or {}).items() if n != 1))
