"""The DynaRL scheduler's barrier rule on the embodied workflow (scheduler.policy
dynarl, emulated workers: `dynarl sim --workload embodied`).

An embodied iteration has no rollout tail to take devices from: every env steps the
same horizon. What is left is the barrier: once the env workers and the policy are
done with the iteration, the learner steps on the whole of it. At that point the
scheduler's own decision (core/scheduler/policy.py decide_dynarl, which at the
barrier is `decide_barrier`) is asked over a ClusterView of the three components;
a plan lends the learner the finished components' devices that it does not hold
already. The learner then trains on them too: warm learner ranks parked on those
devices (a StandbyPool) take their part of the envs, and after the step they are
parked again. Each way costs what the Mover charges a P2P move on emulated devices
(engine_costs.move_costs: the learner's state over one link plus a role switch).
Emulated learners have time, not gradients: the lent ranks train their part of the
envs outside the learner's data-parallel group, which is why the rule is refused for
the gym backend (a real learner would need them in its gradient average).
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from dynarl.components.embodied.workers import LearnerWorker
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.scheduler.policy import ClusterView, ComponentView, DynarlConfig, decide_dynarl
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from dynarl.core.worker_group import WorkerGroup

if TYPE_CHECKING:
    from dynarl.components.workflows.embodied import Embodied


def barrier_view(env: set[int], policy: set[int], learner: tuple[int, ...], sequences: float, now: float,
                 move_cost_s: float) -> ClusterView:
    """Pure: the components at the barrier: env workers and policy ranks finished (what
    they hold apart from the learner is lendable), the learner with the iteration's
    sequences to train."""
    own = set(learner)
    policy_apart = policy - env
    return ClusterView(now, (
        ComponentView("env", "static", len(env), 0.0, finished=True, interruptible=False, lendable=len(env - own)),
        ComponentView("rollout", "static", len(policy_apart), 0.0, finished=True, interruptible=False,
                      lendable=len(policy_apart - own)),
        ComponentView("trainer", "static", len(own), sequences, barrier=True, move_cost_s=move_cost_s)))


class EmbodiedBarrier:
    def __init__(self, wf: "Embodied", move_s: float, config: DynarlConfig) -> None:
        self.wf, self.move_s, self.config = wf, move_s, config
        """move_s: one way of a move (the learner's state over one link and a role switch)."""
        self.pool: StandbyPool | None = None

    def predictor(self, sequences: float) -> Predictor:
        """The learner's sequences per second, linear in its devices (each rank trains its part)."""
        e = self.wf.emulated
        rate = sequences / max(e.train_s(int(sequences), 1), 1e-9)
        return Predictor({"trainer": ThroughputModel([(1, rate), (2, 2 * rate)])})

    async def lend(self, sequences: int, envs: int) -> WorkerGroup | None:
        """At the barrier: the scheduler's decision; a plan's devices get learner ranks for
        this step (returned), after the move's cost; no more ranks in all than `envs`
        (each trains a part of them)."""
        p = self.wf.placement
        view = barrier_view(set(p.env), set(p.rollout), p.trainer, float(sequences),
                            asyncio.get_running_loop().time(), 2 * self.move_s)
        plan = decide_dynarl(view, self.predictor(sequences), self.config)
        if plan is None:
            return None
        own = set(p.trainer)
        free = {"env": sorted(set(p.env) - own), "rollout": sorted(set(p.rollout) - set(p.env) - own)}
        devices = [d for donor, _, n in plan.moves for d in free[donor][:n]][:envs - len(p.trainer)]
        if not devices:
            return None
        wf = self.wf
        if self.pool is None:
            self.pool = StandbyPool(wf.ctl, wf.learner.cls, "trainer", wf.learner_init())
        await self.pool.fill(devices)
        group = self.pool.adopt(devices, "trainer+lent")
        await group.call(LearnerWorker.start, None)
        await self._charge()
        return group

    async def give_back(self, group: WorkerGroup) -> None:
        """After the train step: the lent devices' learner ranks are parked, the devices home."""
        await self.pool.park(group)
        await self._charge()

    async def _charge(self) -> None:
        await asyncio.sleep(self.move_s * self.wf.emulated.time_scale)
