"""What the scheduler did, as it did it: every decision, every move, and each
component's device count after every change of ownership. Times are loop seconds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynarl.core.migration.workload import Taken
    from dynarl.core.scheduler.policy import Plan


@dataclass(slots=True)
class Migration:
    kind: str
    component: str
    devices: list[int]
    started: float
    seconds: float
    kv: "Taken | None" = None
    """A Workload migration's: the moved requests' KV its takers moved in (tokens,
    seconds in the migration's unit) and the requests they prefilled again instead."""


@dataclass(slots=True)
class DecisionRecord:
    at: float
    ms: float
    """The decision's wall-clock time (the policy and its predictor)."""
    plan: "Plan | None"


@dataclass(slots=True)
class DeviceCounts:
    """Each component's device count from `at` until the next sample."""
    at: float
    counts: dict[str, int]


@dataclass(slots=True)
class SchedulerLog:
    decisions: list[DecisionRecord] = field(default_factory=list)
    migrations: list[Migration] = field(default_factory=list)
    counts: list[DeviceCounts] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Moves that rolled back or were left half done (their reasons)."""


def kv_stats(migrations: list[Migration]) -> dict[str, float]:
    """What the Workload migrations' takers did with the moved requests' KV: requests
    and tokens moved in, the seconds that took, and requests prefilled again instead."""
    kv = [m.kv for m in migrations if m.kv is not None]
    return {"migrated_kv_requests": sum(t.kv_requests for t in kv),
            "migrated_kv_tokens": sum(t.kv_tokens for t in kv),
            "migrated_kv_s": sum(t.kv_s for t in kv),
            "migrated_reprefilled_requests": sum(t.reprefilled for t in kv)}


def device_stats(samples: list[DeviceCounts], start: float, end: float) -> dict[str, dict[str, float]]:
    """Each component's device count over [start, end], from the step function
    `samples` (in time order; each holds until the next; the last one at or before
    `start` is the value the window opens with): the time-weighted mean, the min
    and the max. An empty window (end <= start) reports the count at `start`."""
    opening = [s for s in samples if s.at <= start][-1:]
    if not opening:
        raise ValueError(f"no device counts at or before {start}")
    held = opening + [s for s in samples if start < s.at < end]
    names = sorted({name for s in held for name in s.counts})
    stats: dict[str, dict[str, float]] = {}
    for name in names:
        values = [s.counts.get(name, 0) for s in held]
        if end <= start:
            mean = float(values[0])
        else:
            bounds = [start] + [s.at for s in held[1:]] + [end]
            mean = sum(v * (b - a) for v, a, b in zip(values, bounds, bounds[1:])) / (end - start)
        stats[name] = {"mean": mean, "min": float(min(values)), "max": float(max(values))}
    return stats
