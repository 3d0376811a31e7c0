"""Profiling for planners: each component's time for a batch at several device counts.

As RLinf profiles before training, on a batch of its own (not one the run will
use): rollout is measured by running the workflow's rollout component (RolloutWorker,
or for multi-turn workloads AgenticRolloutWorker with an episode driver per engine,
on emulated engines, through the controller, in virtual time) on up to
SAMPLE_ENGINES engines with the groups they would get at that device count,
round-robin; its time is the slowest engine's. Inference and training are linear in the cost model, so each rank's share
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
from dynarl.components.model.spec import ModelSpec
from dynarl.components.placement.profile import StageProfile
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.stage_results import RolloutStats
from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig
from dynarl.components.workflows.agentic_rollout import AgenticRolloutWorker
from dynarl.components.workflows.episodes import Episode, EpisodeDriver, ScriptedTurns
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.prompts import WorkloadPrompts
from dynarl.components.workloads.samples import Group
from dynarl.components.workloads.trace import batch_of
from dynarl.core.worker_group import gather_or_cancel

from dynarl.launch.sim.scenario import Scenario

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
    """The workflow's rollout workers on emulated engines (as a run's), on the groups
    `sampled` of the engines would get; the slowest engine's time. Multi-turn groups
    play their episodes on the agentic workflow's worker, each engine its own groups
    (one episode driver per engine, scripted turns)."""
    sampled = min(engines, SAMPLE_ENGINES)
    mine = [(i, g) for i, g in enumerate(batch) if i % engines < sampled]
    multi_turn = any(s.is_multi_turn for _, g in mine for s in g.samples)
    prompts = WorkloadPrompts([[g for _, g in mine]], cm.get_model(scn.workload.model).vocab_size)
    # (affinity and move_kv are the run's settings, not the engine's)
    engine = {k: v for k, v in scn.engines["rollout"].items() if k not in ("affinity", "move_kv")}
    init = {"model": ModelSpec(), "engine": NativeEngineConfig(), "bucket_bytes": 1 << 20, "backend": "emulated",
            "backend_config": EmulatedRolloutConfig(**dict(engine, time_scale=1.0))}

    async def workflow(ctl):
        loop = asyncio.get_running_loop()
        start = loop.time()
        if multi_turn:
            results = await _play_episodes(ctl, prompts.groups(0), sampled, init, prompts.vocab_size)
        else:
            ctl.channel("prompts", capacity=len(mine) + sampled + 1)
            ctl.channel("rollouts", capacity=len(mine) + 1)
            group = await ctl.spawn(RolloutWorker, name="rollout", devices=[0] * sampled, init=init)
            for item in prompts.groups(0):
                await ctl.channel("prompts").put(item)
            for _ in range(sampled):
                await ctl.channel("prompts").put(END)
            # version -1: the profile's engines hold no policy weights (none is needed to time them)
            results = await group.call(RolloutWorker.generate, "prompts", "rollouts", version=-1, chunk_size=1,
                                       sampling={"max_new_tokens": 1})
        ends = [r.busy[-1][1] for r in results if r.busy]
        return max(ends, default=loop.time()) - start

    config = dynarl.RuntimeConfig(launcher="inproc", cluster=dynarl.ClusterConfig(devices_per_node=1,
                                                                                  device_kind="emulated"))
    return max(dynarl.run(workflow, config, virtual_time=True), 1e-9)


async def _play_episodes(ctl, groups: list[dict], sampled: int, init: dict, vocab_size: int) -> list[RolloutStats]:
    """Engine k serves the episodes of groups k, k + sampled, ... (round-robin, as the
    batch's groups over the engines): one driver per engine, its turns scripted."""
    engine = init["backend_config"]  # as train_config sets the agentic queue
    group = await ctl.spawn(AgenticRolloutWorker, name="rollout", devices=[0] * sampled,
                            init=dict(init, queue=engine.queue, max_bonus_s=engine.priority_window_s))
    keys = [h.spec.worker_id for h in group.handles]
    samples = sum(len(g.samples) for g in groups)
    ctl.channel("turns", capacity=samples + sampled + 1)
    for key in keys:
        ctl.channel(f"turn_results_{key}", capacity=samples + 1)

    async def drive(k: int) -> None:
        key, mine = keys[k], groups[k::sampled]
        scripts = {s.id: s.turns for g in mine for s in g.samples}
        driver = EpisodeDriver(ScriptedTurns(scripts, vocab_size), [key],
                               lambda rank, turn: ctl.channel("turns").put(turn, key=rank),
                               end=lambda rank: ctl.channel("turns").put(END, key=rank))
        episodes = [Episode(s.id, list(g.prompt_ids), s.seed, group=g.index) for g in mine for s in g.samples]
        await driver.run(episodes, ctl.channel(f"turn_results_{key}").get)
        await driver.close()

    serving = group.scatter(AgenticRolloutWorker.serve_turns,
                            [["turns", f"turn_results_{key}", key, -1, {}] for key in keys])
    results, *_ = await gather_or_cancel([serving, *(drive(k) for k in range(sampled))])
    return results


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
    for unit in units:  # inference takes groups, the trainer single samples (the streaming step's)
        t, r = heapq.heappop(free)
        heapq.heappush(free, (t + cost(unit), r))
    return max(max(t for t, _ in free), 1e-9)
