"""What a `dynarl sim` policy is given (PlanContext, Snapshot) and returns (Replan):
the types policy.py and dynarl.py share."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from dynarl.components.placement.plan import Placement
from dynarl.components.placement.profile import StageProfile


@dataclass(frozen=True, slots=True)
class PlanContext:
    num_devices: int
    granularity: Mapping[str, int]
    """Smallest device unit per component (rollout: its TP)."""
    work: Mapping[str, float]
    """Device-seconds per component at full-batch efficiency (the bound's work terms)."""
    switch_s: float
    """Cost of one role switch on time-shared devices."""
    micro_batches: int
    """Pipeline depth assumed by planners."""
    profiles: Mapping[str, StageProfile] | None = None
    """Profiled stage times, for policies with needs_profile."""
    min_devices: Mapping[str, int] = field(default_factory=dict)
    """Fewest devices a component can run on (the trainer: its fp32 state must fit)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a policy sees at an iteration's end. Times are run seconds (emulated)."""
    iteration: int
    now_s: float
    at_iteration_end: bool
    placement: Placement
    stage_s: Mapping[str, float] = field(default_factory=dict)
    """Measured busy seconds per component in the iteration just ended (max over ranks)."""


@dataclass(frozen=True, slots=True)
class Replan:
    """Move to `placement` at the next iteration boundary (reboot migration)."""
    placement: Placement
    reason: str


Decision = Replan


class Policy(Protocol):
    name: str
    needs_profile: bool
    has_hook: bool
    """decide() at every iteration end."""

    def place(self, ctx: PlanContext) -> Placement: ...
    def decide(self, snapshot: Snapshot) -> list[Decision]: ...
    def scheduler(self, engines: int) -> dict | None:
        """`scheduler.dynarl` settings for a run with `engines` rollout engines (None:
        the static scheduler: nothing moves during a step)."""
