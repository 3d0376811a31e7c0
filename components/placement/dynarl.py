"""dynarl and our variants on it, as simulator policies.

The decision is core/scheduler/policy.py's `decide_dynarl` (the paper's Algorithm 1);
this module only turns the simulator's Snapshot into the scheduler's view:

    rollout   dynamic: per-engine "low since" (core/scheduler/policy.py `track_low`:
              active KV / capacity below U_low, the paper's signal, counted once the
              engine is past its fill, as in `dynarl train`'s managers), the
              engines it keeps at least (rollout_demand, core's keep_engines), remaining
              output tokens *estimated* without oracle lengths (rollout_tokens_left:
              as many again as made so far, at least the finished mean, never past
              max_tokens). A rollout that is done
              (`rollout_done`) is interruptible with every engine idle: its engines go
              to the bottleneck like any donor's.
    inference, trainer
              static: remaining sequence tokens (launch/sim/snapshot.py)
    predictor ThroughputModel per component from the cost model's points in the
              snapshot (rollout's for the current active requests)

A committed Plan becomes Migrate decisions: the rollout shrinks by Workload
migration; the receiver grows by its strategy (trainer: p2p, inference: workload).
The start placement gives rollout every device but the fewest the others run on,
and at each iteration start the rollout also borrows those (`rollout_borrows`:
inference and trainer parked, their state in host memory), so it holds the whole
cluster (the paper's Fig 13) and hands devices over as its tail thins out; the
first move gives the lenders their devices back. At an iteration end the runner
moves back to the start placement.

Variants (each measured against dynarl on the same runs):

    dynarl-costaware     commit only if the predicted gain exceeds the migration's cost
    dynarl-consolidate   donor as soon as the active KV, at twice the peak fill, fits on
                         (1 - theta) of the engines (not once theta of the engines have
                         each drained); keeps the engines that needs: the stragglers are
                         consolidated onto fewer engines and more devices move, earlier
    dynarl-tailtp        dynarl's decisions; after each move the kept engines merge pairwise
                         into engines of twice the TP (the simulator's Migrator does it)
"""
from __future__ import annotations

import math

from dynarl.core.scheduler.policy import ComponentView, DynarlConfig, Plan, decide_dynarl, track_low
from dynarl.core.scheduler.policy import ClusterView
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel

from . import plan as plans
from .plan import COMPONENTS, Placement
from .policy import Decision, Migrate, PlanContext, Snapshot, register

STRATEGY = {"trainer": "p2p", "inference": "workload"}
"""How a receiver takes devices (the rollout donor always shrinks by Workload migration)."""

DEFAULT_CONFIG = DynarlConfig()
"""theta 0.8, U_low 0.2, T (window) 4 s, 8 candidates: the scheduler's defaults, used everywhere."""
DECIDE_EVERY_S = 1.0
POLLED_ENGINES_PER_S = 256
"""At scale the scheduler reads the engines' metrics less often: at most this many engine
reports per second of run time (so every 8 s for 2048 engines). Each report is one RPC
per engine (the simulator has no per-node manager to aggregate them, the paper's
design); polling 2048 engines every second was 40% of a 4096-device run's wall time."""


def start_placement(ctx: PlanContext) -> Placement:
    """Rollout on every device but the fewest inference and the trainer need."""
    tp = ctx.granularity.get("rollout", 1)
    inference = max(1, ctx.min_devices.get("inference", 1))
    trainer = max(1, ctx.min_devices.get("trainer", 1))
    rollout = (ctx.num_devices - inference - trainer) // tp * tp
    if rollout < tp:
        raise ValueError(f"{ctx.num_devices} devices leave no rollout engine beside inference {inference} "
                         f"and trainer {trainer}")
    trainer = ctx.num_devices - rollout - inference
    return plans.spatial({"rollout": rollout, "inference": inference, "trainer": trainer})


def decide_period_s(engines: int) -> float:
    """Seconds between decide() calls: DECIDE_EVERY_S, longer past POLLED_ENGINES_PER_S engines."""
    return max(DECIDE_EVERY_S, engines / POLLED_ENGINES_PER_S)


def rollout_done(snap: Snapshot) -> bool:
    """The rollout has finished this iteration's batch: prompts drained, nothing active,
    and requests finished on its engines (an idle engine at the very start has none)."""
    return snap.rollout_active == 0 and snap.rollout_finished_mean > 0 and snap.queue_depth.get("prompts", 1) == 0


def tokens_left(made: float, finished_mean: float, cap: float | None) -> float:
    """Output tokens a running request that has made `made` is expected to make still:
    as many again, and at least the mean length of the requests finished this
    iteration, but never past the cap on its output (no oracle lengths: a capped
    distribution's stragglers mostly run to the cap)."""
    left = max(made, finished_mean)
    if cap is not None:
        left = min(left, max(0.0, cap - made))
    return left


def rollout_tokens_left(snap: Snapshot) -> float:
    """tokens_left for the snapshot's active requests (their mean output so far)."""
    made = snap.rollout_generated / snap.rollout_active if snap.rollout_active else 0.0
    return tokens_left(made, snap.rollout_finished_mean, snap.rollout_max_new_tokens)


class Dynarl:
    name = "dynarl"
    needs_profile = False
    decide_every_s: float | None = DECIDE_EVERY_S
    has_hook = True
    rollout_borrows = True
    """At each iteration start the rollout also runs on the inference's and trainer's
    devices while those are parked (state in host memory), and returns them on the
    first migration, or when it is done (launch/sim/migrate.py: Migrator.lend)."""

    def __init__(self, config: DynarlConfig = DEFAULT_CONFIG) -> None:
        self.config = config
        self.ctx: PlanContext | None = None
        self.low_since: dict[str, float | None] = {}
        self.peak: dict[str, float] = {}
        self.iteration = -1

    def place(self, ctx: PlanContext) -> Placement:
        self.ctx = ctx
        self.decide_every_s = decide_period_s(ctx.num_devices // ctx.granularity.get("rollout", 1))
        return start_placement(ctx)

    # --- the view -------------------------------------------------------------------

    def _track(self, snap: Snapshot) -> tuple[float | None, ...]:
        if snap.iteration != self.iteration:
            self.iteration, self.low_since, self.peak = snap.iteration, {}, {}
        self.low_since, self.peak = track_low(snap.rollout_engines, snap.rollout_utilization, snap.now_s,
                                              self.low_since, self.peak, self.config.u_low)
        return tuple(self.low_since[k] for k in snap.rollout_engines)

    PACK = 1.0
    """The kept engines' KV fill, as a multiple of the engines' mean peak fill."""

    def rollout_demand(self, snap: Snapshot) -> int:
        """Engines the active requests need, the donor's floor (keep_engines): enough
        that their KV fits at the engines' mean peak utilization this iteration, the
        fill they decoded at in the bulk phase. (A floor of one engine per request would
        let rollout shrink only once fewer requests than engines remain, i.e. not before
        the last few dozen of 8192 requests.)"""
        if not snap.rollout_active:
            return 0
        peak = sum(self.peak.values()) / len(self.peak) if self.peak else 0.0
        fill = min(0.9, self.PACK * peak)
        if fill <= 0 or not snap.rollout_capacity:
            return snap.rollout_active
        need = math.ceil(snap.rollout_kv_tokens / (fill * snap.rollout_capacity))
        return max(1, min(snap.rollout_active, need))

    def views(self, snap: Snapshot) -> tuple[ComponentView, ...]:
        low = self._track(snap)
        tp = self.ctx.granularity.get("rollout", 1)
        rollout_left = snap.rollout_active * rollout_tokens_left(snap)
        views = [ComponentView("rollout", "dynamic", snap.devices["rollout"], rollout_left, devices_per_engine=tp,
                               min_devices=tp, interruptible=snap.interruptible.get("rollout", False)
                               or rollout_done(snap),
                               active_requests=snap.rollout_active, keep_engines=self.rollout_demand(snap),
                               engine_low_since=low)]
        for c in ("inference", "trainer"):
            left = snap.remaining_tokens.get(c, 0.0) if snap.accepting.get(c, False) else 0.0
            views.append(ComponentView(c, "static", snap.devices[c], left, devices_per_engine=1,
                                       min_devices=self.ctx.min_devices.get(c, 1),
                                       interruptible=snap.accepting.get(c, False)))
        return tuple(views)

    def predictor(self, snap: Snapshot) -> Predictor:
        return Predictor({c: ThroughputModel(list(snap.rate_points[c])) for c in COMPONENTS})

    # --- the decision ---------------------------------------------------------------

    def decide(self, snapshot: Snapshot) -> list[Decision]:
        if snapshot.at_iteration_end or not snapshot.devices:
            return []  # the runner returns to the start placement at every iteration boundary
        views = self.views(snapshot)
        plan = decide_dynarl(ClusterView(snapshot.now_s, views), self.predictor(snapshot), self.config)
        if plan is None or not self.commit(plan, snapshot):
            return []
        return [Migrate(STRATEGY[receiver], donor, receiver, n) for donor, receiver, n in plan.moves]

    def commit(self, plan: Plan, snapshot: Snapshot) -> bool:
        return True


class DynarlCostAware(Dynarl):
    """Commits a plan only when its predicted gain exceeds what its migrations cost:
    the receivers wait that long for their devices (a p2p move stalls the trainer)."""
    name = "dynarl-costaware"

    def commit(self, plan: Plan, snapshot: Snapshot) -> bool:
        cost = snapshot.migration_cost_s.get("workload", 0.0) + max(
            (snapshot.migration_cost_s.get(STRATEGY[r], 0.0) for _, r, _ in plan.moves), default=0.0)
        return plan.current_time_s - plan.predicted_time_s > cost


class DynarlConsolidate(Dynarl):
    """Consolidates the stragglers earlier. dynarl waits until more than theta of the
    engines have each drained below U_low of their peak; but the stragglers are spread
    over every engine (each engine's own tail), so that happens late. Here the rollout
    counts as a donor once its active KV, packed at twice the engines' peak fill (at
    most 90%), would fit on at most (1 - theta) of the engines it holds, for T seconds:
    Workload migration then packs the stragglers onto the kept engines. Decode is
    memory-bound, so denser engines lose little per-request speed; the predictor's
    rollout points (batch per engine at each engine count) price that loss."""
    name = "dynarl-consolidate"
    PACK = 2.0

    def __init__(self, config: DynarlConfig = DEFAULT_CONFIG) -> None:
        super().__init__(config)
        self.packable_since: float | None = None

    def _track(self, snap: Snapshot) -> tuple[float | None, ...]:
        if snap.iteration != self.iteration:
            self.packable_since = None
        own = super()._track(snap)
        engines = len(snap.rollout_engines)
        packable = engines > 1 and self.rollout_demand(snap) <= (1 - self.config.theta) * engines
        if not packable:
            self.packable_since = None
            return own
        if self.packable_since is None:
            self.packable_since = snap.now_s
        return tuple(self.packable_since for _ in own)


class DynarlTailTP(Dynarl):
    """dynarl, and the engines the rollout keeps as a donor run at twice the TP: after
    each move, pairs of kept engines on one node restart as one wider engine (their
    requests exported, re-imported and re-prefilled; an engine restart and a weight load
    paid), so the stragglers decode with fewer weight bytes per device per step
    (launch/sim/tail_tp.py). The decisions are dynarl's."""
    name = "dynarl-tailtp"
    tail_tp = True


register("dynarl", Dynarl)
register("dynarl-costaware", DynarlCostAware)
register("dynarl-consolidate", DynarlConsolidate)
register("dynarl-tailtp", DynarlTailTP)
