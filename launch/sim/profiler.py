"""Profiling for planners: each component's time for a batch at several device counts.

As RLinf profiles before training, on a batch of its own (not one the run will
use): rollout is measured by running the real rollout component (RolloutWorker
on emulated engines, through the controller, in virtual time) on up to SAMPLE_ENGINES engines with the
groups they would get at that device count, round-robin; its time is the slowest
engine's. Inference and training are linear in the cost model, so each rank's share
is timed with the engines' own cost functions, scheduled as the channel hands
groups out (to the rank that frees up first); the slowest rank counts.
"""
from __future__ import annotations

import asyncio
import heapq

import dynarl
from dynarl.components import costmodel as cm
from dynarl.components.experience import END
from dynarl.components.inference.emulated import EmulatedInference, EmulatedInferenceConfig
from dynarl.components.placement.profile import StageProfile
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.prompts import WorkloadPrompts
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
    """The real rollout worker on emulated engines (as a run's), on the groups `sampled`
    of the engines would get; the slowest engine's time."""
    sampled = min(engines, SAMPLE_ENGINES)
    mine = [(i, g) for i, g in enumerate(batch) if i % engines < sampled]
    multi_turn = any(s.is_multi_turn for _, g in mine for s in g.samples)

    async def workflow(ctl):
        ctl.channel("prompts", capacity=len(mine) + sampled + 1)
        ctl.channel("rollouts", capacity=len(mine) + 1)
        engine = {k: v for k, v in scn.engines["rollout"].items() if k != "affinity"}
        if multi_turn:  # episodes: the simulator's own rollout worker, until they move onto the workflow
            group = await ctl.spawn(SimRolloutWorker, name="rollout", devices=[0] * sampled,
                                    init={"engine": dict(engine, time_scale=1.0)})
            items, call = [g.to_wire(i) for i, g in mine], {"version": 0}
        else:
            group = await ctl.spawn(RolloutWorker, name="rollout", devices=[0] * sampled, init={
                "model": {}, "engine": {}, "bucket_bytes": 1 << 20, "backend": "emulated",
                "backend_config": dict(engine, time_scale=1.0)})
            items = WorkloadPrompts([[g for _, g in mine]], cm.get_model(scn.workload.model).vocab_size).groups(0)
            # version -1: the profile's engines hold no policy weights (none is needed to time them)
            call = {"version": -1, "chunk_size": 1, "sampling": {"max_new_tokens": 1}}
        loop = asyncio.get_running_loop()
        start = loop.time()
        for item in items:
            await ctl.channel("prompts").put(item)
        for _ in range(sampled):
            await ctl.channel("prompts").put(END)
        results = await gather_or_cancel([group.call("generate", "prompts", "rollouts", **call)])
        ends = [r["busy"][-1][1] for r in results[0] if r["busy"]]
        return max(ends, default=loop.time()) - start

    config = dynarl.RuntimeConfig(launcher="inproc", cluster=dynarl.ClusterConfig(devices_per_node=1,
                                                                                  device_kind="emulated"))
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
