"""What crosses a process in a Workload migration, as registered wire records: the
items a released rank exports, and what a kept rank took in."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynarl.transport.wire import register_struct


@register_struct(56)
@dataclass(slots=True)
class WorkItem:
    """One unit of a rank's unfinished work (a rollout group, an agentic turn)."""
    id: str
    weight: float
    """Its expected remaining work, for balancing (in workload_load's unit)."""
    body: Any
    """The component's own data (plain data and records): only its ranks read it."""

    def to_wire(self) -> list[Any]:
        return [self.id, self.weight, self.body]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "WorkItem":
        id_, weight, body = w
        return cls(str(id_), float(weight), body)


@register_struct(57)
@dataclass(slots=True)
class Taken:
    """What a kept rank's workload_import took: its items, and of their requests that
    offered KV, those whose KV it moved in (tokens, measured loop seconds) and those it
    left to be prefilled again (the cheaper choice, or the KV could not be had)."""
    items: int
    kv_requests: int = 0
    kv_tokens: int = 0
    kv_s: float = 0.0
    reprefilled: int = 0

    def moved(self, tokens: int, seconds: float) -> None:
        self.kv_requests += 1
        self.kv_tokens += tokens
        self.kv_s += seconds

    def add(self, other: "Taken") -> None:
        self.items += other.items
        self.kv_requests += other.kv_requests
        self.kv_tokens += other.kv_tokens
        self.kv_s += other.kv_s
        self.reprefilled += other.reprefilled

    def to_wire(self) -> list[Any]:
        return [self.items, self.kv_requests, self.kv_tokens, self.kv_s, self.reprefilled]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "Taken":
        items, kv_requests, kv_tokens, kv_s, reprefilled = w
        return cls(int(items), int(kv_requests), int(kv_tokens), float(kv_s), int(reprefilled))
