"""Policies: a named placement strategy plus an optional online decide() hook.

The simulator (and a real run) asks `place(ctx)` for the starting placement, then,
if the policy has a hook, calls `decide(snapshot)` (every `decide_every_s` seconds
of run time during an iteration, and at every iteration end) and executes the
decisions it returns. decide() is timed: that is the policy's decision time.

    colocated   verl-like: every device does rollout, then inference, then training
    spatial     fixed split (split.py), the stages pipelined over channels
    rlinf-auto  RLinf's profiling-guided planner (planner.py), re-planned when a
                measured stage time drifts more than 15% from the profile
    dynarl      the paper's dynamic scheduler (dynarl.py): online migrations from the
                rollout tail to the bottleneck, decided by core/scheduler/policy.py

A new policy (e.g. each improvement on dynarl) registers a factory under its own
name, so its gain is measured against the others on the same runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from . import plan as plans
from .drift import DEFAULT_THRESHOLD, drifted
from .plan import Placement
from .planner import plan as rlinf_plan
from .profile import StageProfile
from .split import proportional_split


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
    """What a policy sees when decide() runs. Times are run seconds (emulated)."""
    iteration: int
    now_s: float
    at_iteration_end: bool
    placement: Placement
    stage_s: Mapping[str, float] = field(default_factory=dict)
    """Measured busy seconds per component in the iteration just ended (max over ranks)."""
    rollout_utilization: tuple[float, ...] = ()
    """Active KV tokens / capacity per rollout engine (the DynaRL donor signal)."""
    queue_depth: Mapping[str, int] = field(default_factory=dict)
    """Items waiting per channel."""
    # --- what an online scheduler (dynarl) reads; filled during an iteration ---------
    devices: Mapping[str, int] = field(default_factory=dict)
    """Devices each component holds now (may differ from the placement after migrations)."""
    rollout_engines: tuple[str, ...] = ()
    """Worker id of each rollout engine, in the order of rollout_utilization."""
    rollout_active: int = 0
    """Requests running or waiting over all rollout engines."""
    rollout_generated: int = 0
    """Output tokens those active requests have made so far."""
    rollout_max_new_tokens: int | None = None
    """The cap on a request's output tokens (the math workload's length cap, what a real
    run's max_tokens is); None: not capped, or not known (multi-turn, a trace)."""
    rollout_kv_tokens: int = 0
    """Active KV tokens over all rollout engines."""
    rollout_capacity: int = 0
    """KV capacity of one rollout engine, in tokens."""
    rollout_finished_mean: float = 0.0
    """Mean output length of the requests finished this iteration (0: none yet)."""
    remaining_tokens: Mapping[str, float] = field(default_factory=dict)
    """inference, trainer: sequence tokens still to process this iteration (estimated)."""
    rate_points: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    """Profiled (devices, tokens/s) per component, from the cost model (the predictor's points)."""
    interruptible: Mapping[str, bool] = field(default_factory=dict)
    """Whether the component may be resized now (rollout: its prompt channel is drained)."""
    accepting: Mapping[str, bool] = field(default_factory=dict)
    """Whether the component can still use more devices this iteration."""
    migration_cost_s: Mapping[str, float] = field(default_factory=dict)
    """Cost of one migration per kind (workload, p2p), from the cost model."""


@dataclass(frozen=True, slots=True)
class Replan:
    """Move to `placement` at the next iteration boundary (reboot migration)."""
    placement: Placement
    reason: str


@dataclass(frozen=True, slots=True)
class Migrate:
    """Move `devices` devices from one component to another during an iteration,
    with a migration strategy (workload / p2p / reboot). Executed from issue 5 on."""
    kind: str
    source: str
    target: str
    devices: int


Decision = Replan | Migrate


class Policy(Protocol):
    name: str
    needs_profile: bool
    decide_every_s: float | None
    """Period of decide() during an iteration; None: only at iteration ends."""
    has_hook: bool

    def place(self, ctx: PlanContext) -> Placement: ...
    def decide(self, snapshot: Snapshot) -> list[Decision]: ...


class PolicyUnavailable(ValueError):
    """A known policy that this build cannot run yet."""


class Colocated:
    name = "colocated"
    needs_profile = False
    decide_every_s = None
    has_hook = False

    def place(self, ctx: PlanContext) -> Placement:
        return plans.colocated(ctx.num_devices)

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        return []


class Spatial(Colocated):
    name = "spatial"

    def place(self, ctx: PlanContext) -> Placement:
        return plans.spatial(proportional_split(ctx.work, ctx.num_devices, ctx.granularity))


class RlinfAuto:
    """Plan from the profile; at each iteration end, compare measured stage times with
    the plan's; past the threshold, fold the measurements into the profile and re-plan."""
    name = "rlinf-auto"
    needs_profile = True
    decide_every_s = None
    has_hook = True

    def __init__(self, threshold: float = DEFAULT_THRESHOLD) -> None:
        self.threshold = threshold
        self.ctx: PlanContext | None = None
        self.profiles: dict[str, StageProfile] = {}
        self.predicted: dict[str, float] = {}
        self.replans = 0

    def place(self, ctx: PlanContext) -> Placement:
        if ctx.profiles is None:
            raise ValueError("rlinf-auto needs profiles in its PlanContext")
        self.ctx = ctx
        self.profiles = dict(ctx.profiles)
        return self._plan().placement

    def _plan(self):
        ctx = self.ctx
        result = rlinf_plan(self.profiles, ctx.num_devices, granularity=ctx.granularity,
                            switch_s=ctx.switch_s, micro_batches=ctx.micro_batches)
        self.predicted = dict(result.stage_s)
        return result

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        if not snapshot.at_iteration_end or not snapshot.stage_s:
            return []
        moved = drifted(self.predicted, snapshot.stage_s, self.threshold)
        if not moved:
            return []
        for c in moved:
            self.profiles[c] = self.profiles[c].with_point(snapshot.placement.num_devices_of(c), snapshot.stage_s[c])
        result = self._plan()
        if result.placement == snapshot.placement:
            return []
        self.replans += 1
        return [Replan(result.placement, f"drift > {self.threshold:.0%} in {', '.join(moved)}")]


PolicyFactory = Callable[[], Policy]

REGISTRY: dict[str, PolicyFactory] = {
    "colocated": Colocated,
    "spatial": Spatial,
    "rlinf-auto": RlinfAuto,
}

UNAVAILABLE: dict[str, str] = {}


def make_policy(name: str) -> Policy:
    if name in UNAVAILABLE:
        raise PolicyUnavailable(f"policy {name!r}: {UNAVAILABLE[name]}")
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return factory()


def register(name: str, factory: PolicyFactory) -> None:
    """Adds a policy (e.g. an improvement on dynarl, under its own name)."""
    if name in REGISTRY:
        raise ValueError(f"a policy named {name!r} is already registered")
    REGISTRY[name] = factory
    UNAVAILABLE.pop(name, None)


from . import dynarl as _dynarl  # noqa: E402,F401  registers dynarl and its variants (it imports this module)
from . import agentic as _agentic  # noqa: E402,F401  registers dynarl-noprio (agentic request handling)
