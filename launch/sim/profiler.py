"""Profiling for planners: each component's time for a batch at several device counts.

As RLinf profiles before training, on a batch of its own (not one the run will
use): rollout is measured by running the real rollout component (SimRolloutWorker
through the controller, in virtual time) on up to SAMPLE_ENGINES engines with the
groups they would get at that device count, round-robin; its time is the slowest
engine's. Inference and training are linear in the cost model, so each rank's share
is timed with the engines' own cost functions, scheduled as the channel hands
groups out (to the rank that frees up first); the slowest rank counts.
"""
from __future__ import annotations

import asyncio
import heapq

import dynarl
from dynarl.components.experience import END
from dynarl.components.inference.emulated import EmulatedInference, EmulatedInferenceConfig
from dynarl.components.placement.profile import StageProfile
from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.samples import Group
from dynarl.components.workloads.trace import batch_of
from dynarl.core.worker_group import gather_or_cancel

from .rollout_worker import SimRolloutWorker
from .scenario import Scenario

PROFILE_ITERATION = 2**31 - 1
"""The profiling batch's iteration index: a batch no run iteration uses."""
FRACTIONS = (8, 4, 2, 1)
"""Profile at N/8, N/4, N/2 and N devices."""
SAMPLE_ENGINES = 8


def profile_stages(scn: Scenario) -> dict[str, StageProfile]:
    cfg, tp = scn.config, scn.rollout_tp
    prompts = len(scn.batches[0])
    batch = (batch_of(scn.trace, PROFILE_ITERATION % 7, prompts) if scn.trace
             else generate(scn.workload, cfg.seed, PROFILE_ITERATION, prompts))
    counts = sorted({max(tp, cfg.devices // f // tp * tp) for f in FRACTIONS})
    return {
        "rollout": StageProfile(tuple((n, rollout_time(scn, batch, n // tp)) for n in counts)),
        "inference": StageProfile(tuple((n, _linear_time(scn, batch, n, "inference")) for n in counts)),
        "trainer": StageProfile(tuple((n, _linear_time(scn, batch, n, "trainer")) for n in counts)),
    }


def rollout_time(scn: Scenario, batch: list[Group], engines: int) -> float:
    sampled = min(engines, SAMPLE_ENGINES)
    mine = [(i, g) for i, g in enumerate(batch) if i % engines < sampled]

    async def workflow(ctl):
        ctl.channel("prompts", capacity=len(mine) + sampled + 1)
        ctl.channel("rollouts", capacity=len(mine) + 1)
        group = await ctl.spawn(SimRolloutWorker, name="rollout", devices=[0] * sampled,
                                init={"engine": dict(scn.engines["rollout"], time_scale=1.0)})
        loop = asyncio.get_running_loop()
        start = loop.time()
        for i, g in mine:
            await ctl.channel("prompts").put(g.to_wire(i))
        for _ in range(sampled):
            await ctl.channel("prompts").put(END)
        results = await gather_or_cancel([group.call("generate", "prompts", "rollouts", version=0)])
        ends = [r["busy"][-1][1] for r in results[0] if r["busy"]]
        return max(ends, default=loop.time()) - start

    config = dynarl.RuntimeConfig(launcher="inproc", cluster=dynarl.ClusterConfig(devices_per_node=1))
    return max(dynarl.run(workflow, config, virtual_time=True), 1e-9)


def _linear_time(scn: Scenario, batch: list[Group], ranks: int, component: str) -> float:
    """Ranks take groups as they free up (the channel's pull order): greedy list
    scheduling in batch order; the component's time is the last rank's finish."""
    if component == "inference":
        engine = EmulatedInference(EmulatedInferenceConfig(**dict(scn.engines["inference"], time_scale=1.0)))
        cost = engine.forward_time
    else:
        trainer = EmulatedTrainer(emulation=EmulatedTrainerConfig(**dict(scn.engines["trainer"], time_scale=1.0)))
        cost = trainer.step_time
    units = ([[s.sequence_tokens(g.prompt_tokens) for s in g.samples] for g in batch] if component == "inference"
             else [[s.sequence_tokens(g.prompt_tokens)] for g in batch for s in g.samples])
    free = [(0.0, r) for r in range(ranks)]
    for unit in units:  # inference takes groups, the trainer single samples (inference_worker.py)
        t, r = heapq.heappop(free)
        heapq.heappush(free, (t + cost(unit), r))
    return max(max(t for t, _ in free), 1e-9)
