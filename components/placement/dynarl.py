"""dynarl and our variants on it, as `dynarl sim` policies: each is a start placement
and the `scheduler.dynarl` settings the run's scheduler takes. The scheduler is
`dynarl train`'s own (components/workflows/dynamic.py over core/scheduler and
core/migration): the simulator runs it on emulated engines.

The start placement gives rollout every device but the fewest the others run on
(the trainer: its fp32 state must fit), and at each step's start the rollout also
borrows those (`lend`: inference and trainer parked, their state in host memory),
so it holds the whole cluster (the paper's Fig 13) and hands devices over as its
tail thins out; the first move gives the lenders their devices back. Every
component moves as the paper's commit rule says (moves are free: the cost model
charges them as they happen), and the scheduler reads the engines' metrics at most
POLLED_ENGINES_PER_S engine reports per second of run time.

Variants (each measured against dynarl on the same runs):

    dynarl-costaware     charges each moving component its measured move cost (its last
                         round trip): a move that cannot pay for itself is not made
    dynarl-consolidate   donor as soon as the active KV, at twice the peak fill, fits on
                         (1 - theta) of the engines (not once theta of the engines have
                         each drained); keeps the engines that needs: the stragglers are
                         consolidated onto fewer engines and more devices move, earlier
    dynarl-tailtp        dynarl's decisions; after each move the kept engines merge pairwise
                         into engines of twice the TP (core/migration/tail_tp.py)
    dynarl-kv            dynarl with rollout.move_kv: a request a Workload migration moves
                         takes its KV along (priced over NVLink or the NIC,
                         costmodel.kv_transfer_time) instead of being re-prefilled
    dynarl-async         dynarl with partial rollout at staleness 1 (rollout.oversample 1.5,
                         algorithm.max_staleness 1): no step waits for its longest samples
"""
from __future__ import annotations

import dataclasses
from typing import Any

from dynarl.core.scheduler.policy import DynarlConfig

from dynarl.components.placement import plan as plans
from dynarl.components.placement.plan import Placement
from dynarl.components.placement.context import PlanContext, Snapshot

DEFAULT_CONFIG = DynarlConfig(charge_move_cost=False)
"""theta 0.8, U_low 0.2, T (window) 4 s, 8 candidates; moves not charged (the paper's rule)."""
DECIDE_EVERY_S = 1.0
POLLED_ENGINES_PER_S = 256
"""At scale the scheduler reads the engines' metrics less often: at most this many engine
reports per second of run time (so every 8 s for 2048 engines). Each report is one RPC
per engine (no per-node manager aggregates them, the paper's design); polling 2048
engines every second was 40% of a 4096-device run's wall time."""


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
    """Seconds between decisions: DECIDE_EVERY_S, longer past POLLED_ENGINES_PER_S engines."""
    return max(DECIDE_EVERY_S, engines / POLLED_ENGINES_PER_S)


class Dynarl:
    name = "dynarl"
    needs_profile = False
    has_hook = False
    tail_tp = False
    move_kv = False

    def __init__(self, config: DynarlConfig = DEFAULT_CONFIG) -> None:
        self.config = config

    def place(self, ctx: PlanContext) -> Placement:
        return start_placement(ctx)

    def decide(self, snapshot: Snapshot) -> list:
        return []  # the scheduler returns to the start placement at every step's end

    def scheduler(self, engines: int) -> dict[str, Any]:
        """The run's `scheduler.dynarl` settings, for `engines` rollout engines."""
        period = decide_period_s(engines)
        return {**dataclasses.asdict(self.config), "interval_s": period, "tail_interval_s": period,
                "lend": True, "tail_tp": self.tail_tp}


class DynarlCostAware(Dynarl):
    """Charges each moving component its measured move cost: the receivers wait that
    long for their devices (a p2p move stalls the trainer)."""
    name = "dynarl-costaware"

    def __init__(self, config: DynarlConfig = DEFAULT_CONFIG) -> None:
        super().__init__(dataclasses.replace(config, charge_move_cost=True))


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

    def __init__(self, config: DynarlConfig = DEFAULT_CONFIG) -> None:
        super().__init__(dataclasses.replace(config, pack=2.0, donor="packable"))


class DynarlTailTP(Dynarl):
    """dynarl, and the engines the rollout keeps as a donor run at twice the TP: after
    each move, pairs of kept engines on one node restart as one wider engine (their
    requests exported, re-imported and re-prefilled; an engine restart and a weight load
    paid), so the stragglers decode with fewer weight bytes per device per step
    (core/migration/tail_tp.py). The decisions are dynarl's."""
    name = "dynarl-tailtp"
    tail_tp = True


class DynarlKV(Dynarl):
    """dynarl, and the requests a Workload migration moves take their KV along: the
    kept engines import it into their prefix caches and compute only the last block
    again, instead of the whole context (issue 21)."""
    name = "dynarl-kv"
    move_kv = True


class DynarlAsync(Dynarl):
    """dynarl with partial rollout at staleness 1 (rollout.oversample 1.5,
    algorithm.max_staleness 1, components/workflows/partial.py): N x 1.5 groups
    generate on the whole cluster (lending), the step trains the first N to finish and
    carries the rest, tokens kept, into the next step; at the batch's close the
    rollout is over for the step and its engines give their devices to inference and
    the trainer. A group that would be trained two versions late is waited for (due),
    not generated again."""
    name = "dynarl-async"
    oversample = 1.5
    max_staleness = 1

