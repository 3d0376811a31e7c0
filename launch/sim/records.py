"""What one policy's simulated run records, for metrics.py and plot.py."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from dynarl.components.placement.plan import Placement


@dataclass(slots=True)
class IterationRecord:
    index: int
    start: float
    end: float
    busy_device_s: float
    tokens: int
    samples: int
    stage_s: dict[str, float]
    """Measured stage time: the busy seconds of the component's slowest rank."""
    span_s: dict[str, float]
    """Seconds each component held its devices (StageClock)."""


@dataclass(slots=True)
class PolicyRun:
    policy: str
    placements: list[tuple[float, Placement]] = field(default_factory=list)
    iterations: list[IterationRecord] = field(default_factory=list)
    ownership: list[tuple[str, int, float, float]] = field(default_factory=list)
    """(component, devices, start, end): who held which number of devices when."""
    busy: list[tuple[float, float, int]] = field(default_factory=list)
    """(start, end, devices) a component computed on."""
    decision_ms: list[float] = field(default_factory=list)
    migrations: dict[str, list[float]] = field(default_factory=dict)
    """kind -> cost in seconds of each migration."""
    notes: list[str] = field(default_factory=list)
    preemptions: int = 0
    reprefill_tokens: list[int] = field(default_factory=list)
    """Per iteration: context tokens computed before that an engine computed again (agentic)."""
    moved_reprefill_tokens: list[int] = field(default_factory=list)
    """Per iteration: tokens the requests migrations moved computed again where they went."""
    turn_kv: list[dict[str, float]] = field(default_factory=list)
    """Per iteration (agentic): follow-up turns whose last engine left, with its KV of their
    context: moved in (requests, tokens, seconds), or prefilled again."""
    moved_kv: list[dict[str, float]] = field(default_factory=list)
    """Per iteration (with a scheduler): the moved requests' KV moved in (core/scheduler/log.kv_stats)."""
    max_staleness: int = 0
    """The policy's algorithm.max_staleness (its steps overlap the next rollout)."""
    staleness_counts: list[dict[int, int]] = field(default_factory=list)
    """Per iteration: trained samples by how many versions their oldest token was behind (the ledger's)."""
    carried: list[tuple[int, int, int]] = field(default_factory=list)
    """Per iteration (partial rollout): groups started and not trained at its end, their
    tokens so far (the backlog later steps inherit), and their samples not finished."""
    regenerated: list[tuple[int, int]] = field(default_factory=list)
    """Per iteration (partial rollout): groups with samples generated again from the
    prompt as their tokens would have been too stale, and the tokens dropped with them."""

    survived: list[int] = field(default_factory=list)
    """Per iteration: ranks lost and replaced in place (SimConfig.failures)."""
    lost_at: list[float] = field(default_factory=list)
    """Run seconds at which a rank was lost (SimConfig.failures that came while the run lasted)."""

    @property
    def staleness(self) -> list[int]:
        """Per iteration: the most versions a trained sample's weights were behind."""
        return [max(counts, default=0) for counts in self.staleness_counts]


def timed(policy, snapshot, run: PolicyRun) -> list:
    """The policy's decisions, its wall-clock decision time recorded in `run`."""
    started = time.perf_counter()
    decisions = policy.decide(snapshot)
    run.decision_ms.append((time.perf_counter() - started) * 1e3)
    return decisions


class Quiet:
    """GRPO's progress display, silent."""

    def stage(self, name: str) -> None: ...
    def warmup(self, done: int, total: int) -> None: ...
    def step(self, metrics: dict) -> None: ...
    def note(self, text: str) -> None: ...
