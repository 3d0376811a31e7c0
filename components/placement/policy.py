"""Policies of `dynarl sim`: a named placement strategy, optionally re-planned at
iteration ends, or the DynaRL scheduler moving devices during them.

The simulator asks `place(ctx)` for the starting placement. A policy with a hook
(`has_hook`) is asked `decide(snapshot)` at every iteration end and the re-plans
it returns are carried out (a reboot of every group); decide() is timed. An online
policy's `scheduler(engines)` gives the `scheduler.dynarl` settings of the run:
then the job's own scheduler (components/workflows/dynamic.py) moves devices
during every step, as in `dynarl train`.

    colocated   verl-like: every device does rollout, then inference, then training
    spatial     fixed split (split.py), the stages pipelined over channels
    rlinf-auto  RLinf's profiling-guided planner (planner.py), re-planned when a
                measured stage time drifts more than 15% from the profile
    dynarl      the paper's dynamic scheduler (dynarl.py): online migrations from the
                rollout tail to the bottleneck, by `dynarl train`'s own scheduler
    async       the peers' asynchronous mode (verl fully_async / AReaL): the spatial
                split, and the next step's rollout runs while a step trains
                (algorithm.max_staleness 1: `dynarl train`'s overlapped steps)
    partial     slime / APRIL partial rollout: colocated, N x 1.5 groups generate, the
                first N to finish train, the rest continue in later steps
                (rollout.oversample: `dynarl train`'s partial rollout)

A new policy (e.g. each improvement on dynarl) registers a factory under its own
name, so its gain is measured against the others on the same runs.
"""
from __future__ import annotations

from typing import Callable

from dynarl.components.placement import plan as plans
from dynarl.components.placement.agentic import DynarlFifo, DynarlNoPrio
from dynarl.components.placement.context import Decision, PlanContext, Policy, Replan, Snapshot
from dynarl.components.placement.drift import DEFAULT_THRESHOLD, drifted
from dynarl.components.placement.dynarl import (Dynarl, DynarlAsync, DynarlConsolidate, DynarlCostAware, DynarlKV,
                                                DynarlTailTP)
from dynarl.components.placement.plan import Placement
from dynarl.components.placement.planner import plan as rlinf_plan
from dynarl.components.placement.profile import StageProfile
from dynarl.components.placement.split import proportional_split


class PolicyUnavailable(ValueError):
    """A known policy that this build cannot run yet."""


class Colocated:
    name = "colocated"
    needs_profile = False
    has_hook = False
    max_staleness = 0
    """algorithm.max_staleness of the run (components/workflows/overlap.py)."""

    def place(self, ctx: PlanContext) -> Placement:
        return plans.colocated(ctx.num_devices)

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        return []

    def scheduler(self, engines: int) -> dict | None:
        return None


class Spatial(Colocated):
    name = "spatial"

    def place(self, ctx: PlanContext) -> Placement:
        return plans.spatial(proportional_split(ctx.work, ctx.num_devices, ctx.granularity))


class Hybrid(Colocated):
    """RLinf-Hybrid for reasoning: rollout on a pool of its own (pipelined into the
    rest), inference and trainer time-sharing the other pool; the pools sized by the
    work split (rollout's share against the other two's)."""
    name = "hybrid"

    def place(self, ctx: PlanContext) -> Placement:
        rollout = proportional_split(ctx.work, ctx.num_devices, ctx.granularity)["rollout"]
        return plans.hybrid(rollout, ctx.num_devices)


class AsyncSpatial(Spatial):
    """Disaggregated pools with one step of staleness, as verl's fully_async and
    AReaL run by default: the rollout generates step s + 1 on the weights of step s
    while the trainer takes step s (docs/simulation.md)."""
    name = "async"
    max_staleness = 1


class PartialColocated(Colocated):
    """slime's partial rollout (`--partial-rollout`) with over-sampling, as APRIL runs
    it on colocated devices: N x oversample prompt groups generate, the step trains the
    first N to finish, the unfinished ones continue in later steps from their tokens so
    far (rollout.oversample: `dynarl train`'s partial rollout, components/workflows/
    partial.py). slime bounds no staleness (a sample may continue over many steps):
    nor does this policy; the run reports how stale its samples were."""
    name = "partial"
    oversample = 1.5
    max_staleness = 1 << 20
    """No bound (an int the config takes)."""


class RlinfAuto(Colocated):
    """Plan from the profile; at each iteration end, compare measured stage times with
    the plan's; past the threshold, fold the measurements into the profile and re-plan."""
    name = "rlinf-auto"
    needs_profile = True
    has_hook = True

    def __init__(self, threshold: float = DEFAULT_THRESHOLD) -> None:
        self.threshold = threshold
        self.ctx: PlanContext | None = None
        self.profiles: dict[str, StageProfile] = {}
        self.predicted: dict[str, float] = {}

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
        return [Replan(result.placement, f"drift > {self.threshold:.0%} in {', '.join(moved)}")]


PolicyFactory = Callable[[], Policy]

REGISTRY: dict[str, PolicyFactory] = {
    "colocated": Colocated,
    "spatial": Spatial,
    "hybrid": Hybrid,
    "async": AsyncSpatial,
    "partial": PartialColocated,
    "rlinf-auto": RlinfAuto,
    "dynarl": Dynarl,
    "dynarl-async": DynarlAsync,
    "dynarl-costaware": DynarlCostAware,
    "dynarl-consolidate": DynarlConsolidate,
    "dynarl-tailtp": DynarlTailTP,
    "dynarl-kv": DynarlKV,
    "dynarl-noprio": DynarlNoPrio,
    "dynarl-fifo": DynarlFifo,
}

UNAVAILABLE: dict[str, str] = {}

SUMMARIES: dict[str, str] = {
    "colocated": "verl-like: every device does rollout, then inference, then training (the baseline)",
    "spatial": "a fixed split of the devices between the stages, pipelined over channels",
    "hybrid": "rollout on a pool of its own; inference and training time-share the other pool",
    "async": "spatial, and the next step's rollout runs while a step trains, one step stale "
             "(verl fully_async, AReaL)",
    "partial": "colocated partial rollout (slime, APRIL): 1.5 x the groups generate, the first to "
               "finish train, the rest continue later",
    "rlinf-auto": "RLinf's profile-guided plan, re-planned when a stage's time drifts over 15%",
    "dynarl": "the DynaRL scheduler: moves devices from the rollout's tail to the bottleneck during "
              "every step",
    "dynarl-async": "dynarl with partial rollout at staleness 1",
    "dynarl-costaware": "dynarl, each move charged its measured cost (the receivers wait for their devices)",
    "dynarl-consolidate": "dynarl, consolidating the rollout's stragglers earlier",
    "dynarl-tailtp": "dynarl, the kept rollout engines restarted at twice the TP for the tail",
    "dynarl-kv": "dynarl, moved requests taking their KV along instead of prefilling again",
    "dynarl-noprio": "dynarl's device moves with FIFO queues and no cache affinity (agentic)",
    "dynarl-fifo": "dynarl's device moves and cache affinity, with FIFO queues (agentic)",
}
"""One line per policy, for `dynarl sim --help` (describe)."""


def describe(name: str) -> str:
    """A policy in one line: its summary, else the first line of its factory's docstring."""
    if name in SUMMARIES:
        return SUMMARIES[name]
    doc = (REGISTRY[name].__doc__ or "").strip()
    return doc.splitlines()[0] if doc else ""


def overlaps(policy: object) -> bool:
    """The policy's steps overlap the next one's rollout (algorithm.max_staleness without
    partial rollout)."""
    return getattr(policy, "max_staleness", 0) > 0 and getattr(policy, "oversample", 1.0) == 1.0


def make_policy(name: str) -> Policy:
    if name in UNAVAILABLE:
        raise PolicyUnavailable(f"policy {name!r}: {UNAVAILABLE[name]}")
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return factory()


def register(name: str, factory: PolicyFactory, summary: str | None = None) -> None:
    """Adds a policy (e.g. an improvement on dynarl, under its own name); `summary`: its
    line in `dynarl sim --help` (default: its docstring's first line)."""
    if name in REGISTRY:
        raise ValueError(f"a policy named {name!r} is already registered")
    REGISTRY[name] = factory
    if summary is not None:
        SUMMARIES[name] = summary
    UNAVAILABLE.pop(name, None)
