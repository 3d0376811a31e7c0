"""Placement: the workflow chain cut into segments, each on a block of devices.

Components within one segment time-share the segment's devices (temporal:
device_lock, one after the other); segments run concurrently and stream data
to each other through channels (spatial). So:

    colocated  [rollout, inference, trainer] : N
    spatial    [rollout] : a | [inference] : b | [trainer] : c
    hybrid     e.g. [rollout] : a | [inference, trainer] : N - a

Segments keep the chain order and take contiguous device blocks in that order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

COMPONENTS = ("rollout", "inference", "trainer")
"""The GRPO chain, in data-dependency order."""


@dataclass(frozen=True, slots=True)
class Segment:
    components: tuple[str, ...]
    devices: int


@dataclass(frozen=True, slots=True)
class Placement:
    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        order = [c for s in self.segments for c in s.components]
        if tuple(order) != COMPONENTS:
            raise ValueError(f"segments must cover {', '.join(COMPONENTS)} once each, in that order; got {order}")
        for s in self.segments:
            if s.devices < 1:
                raise ValueError(f"segment {'+'.join(s.components)} has {s.devices} devices")

    @property
    def num_devices(self) -> int:
        return sum(s.devices for s in self.segments)

    @property
    def mode(self) -> Literal["temporal", "spatial", "hybrid"]:
        if len(self.segments) == 1:
            return "temporal"
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

    def device_ids(self, component: str) -> list[int]:
        index, segment = self.segment_of(component)
        start = sum(s.devices for s in self.segments[:index])
        return list(range(start, start + segment.devices))

    def shares_devices(self, component: str) -> bool:
        return len(self.segment_of(component)[1].components) > 1

    def describe(self) -> str:
        return " | ".join(f"{'+'.join(s.components)}:{s.devices}" for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "segments": self.describe(),
                "devices": {c: self.num_devices_of(c) for c in COMPONENTS}}


def colocated(num_devices: int) -> Placement:
    return Placement((Segment(COMPONENTS, num_devices),))


def spatial(counts: dict[str, int]) -> Placement:
    return Placement(tuple(Segment((c,), counts[c]) for c in COMPONENTS))
