"""The DataRouter: which worker of a group gets an item, and what moving it costs.

Each item carries its affinity (`must`: only the worker holding its state,
`prefer`: that worker unless it is gone or saturated, `none`) and its status
(steps so far, tool calls, cached prefix tokens, the worker last used). `route`
is a pure decision; `DataRouter` wraps it with counters.

When an item with a prefix leaves the worker that cached it (that worker was
removed by a migration, or is saturated for a `prefer` item), the new worker
must prefill the prefix again: those tokens are the re-prefill cost, counted.
(With rollout.move_kv a worker a migration removes first offers the prefix's KV,
and the new worker moves it in where that is cheaper, components/rollout/kv_choice.py:
the count here is the cost without it; the episode driver measures what is computed.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping

Affinity = Literal["must", "prefer", "none"]


@dataclass(slots=True)
class ItemStatus:
    affinity: Affinity = "none"
    last_worker: str | None = None
    steps: int = 0
    tool_calls: int = 0
    cached_prefix: int = 0
    """Context tokens the last worker holds in its prefix cache for this item."""


@dataclass(frozen=True, slots=True)
class WorkerState:
    load: float
    """Queue pressure in [0, 1]: active KV / capacity, or queued / max queued."""
    alive: bool = True


@dataclass(frozen=True, slots=True)
class Route:
    worker: str
    reprefill_tokens: int
    reason: str
    """'affinity', 'least-loaded', 'fallback-gone' or 'fallback-saturated'."""


class NoWorkers(RuntimeError):
    """Every worker of the group is gone."""


def route(status: ItemStatus, workers: Mapping[str, WorkerState], saturation: float = 0.9) -> Route:
    """Pure: picks a worker for one item. Least loaded wins among equals, then the
    lowest id, so decisions are deterministic."""
    alive = {w: s for w, s in workers.items() if s.alive}
    if not alive:
        raise NoWorkers("no live worker to route to")
    home = status.last_worker
    if status.affinity != "none" and home is not None and home in alive:
        if status.affinity == "must" or alive[home].load < saturation:
            return Route(home, 0, "affinity")
    target = min(alive, key=lambda w: (alive[w].load, w))
    if status.affinity == "none" or home is None:
        return Route(target, 0, "least-loaded")
    reason = "fallback-gone" if home not in alive else "fallback-saturated"
    return Route(target, status.cached_prefix, reason)


@dataclass(slots=True)
class DataRouter:
    saturation: float = 0.9
    routed: int = 0
    reprefill_tokens: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)

    def distribute(self, status: ItemStatus, workers: Mapping[str, WorkerState]) -> Route:
        decision = route(status, workers, self.saturation)
        self.routed += 1
        self.reprefill_tokens += decision.reprefill_tokens
        self.by_reason[decision.reason] = self.by_reason.get(decision.reason, 0) + 1
        status.last_worker = decision.worker
        if decision.reprefill_tokens:
            status.cached_prefix = 0  # the new worker starts cold
        return decision
