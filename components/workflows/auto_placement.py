"""placement.mode=auto: `dynarl train` places its components as rlinf-auto does in
`dynarl sim` (components/placement/policy.py RlinfAuto over planner.py), from a
profile of this job's own engines taken before training.

    rollout    one rank of the job's rollout worker generates one engine's share of
               the first step's prompt groups (ceil(groups / k) of them) for k in
               profile_counts(devices): continuous batching makes that concave in k
    inference  one rank computes the log-probs of that whole batch (twice when the
               loss has a KL term: the reference pass costs the same); linear in devices
    trainer    one throwaway rank takes one train step on the batch; linear in devices
    switch_s   the rollout rank's offload plus the inference rank's onload (the hand-over
               between two stages that time-share a device)

Where the steps run no inference stage (inference.old_logprobs auto: old_logprobs.py)
the plan still has the chain's three stages, inference's time counted: its devices are
planned, no inference rank is spawned on them.

The profiling ranks time-share device 0 (each onloaded for its part only, as in a
colocated placement), at weight version -1 (no policy yet: RLinf profiles before
training too), and are stopped before the job's groups start, also when the
profile fails or is cancelled; the
rewards of the batch are zeros (a train step's time does not depend on them). The
profile and the plan are written to the run directory (placement.json).
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import Any

from dynarl.components import experience
from dynarl.components.experience import END
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.placement.policy import PlanContext, RlinfAuto
from dynarl.components.placement.profile import StageProfile
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.core.worker_group import WorkerGroup

PROBE = ("profile_prompts", "profile_rollouts", "profile_scored", "profile_experience")
"""The profile's own channels (the job's are untouched)."""


def profile_counts(num_devices: int) -> list[int]:
    """Pure: the device counts the rollout is timed at: powers of two below the
    cluster's size, and the size itself."""
    counts, k = [], 1
    while k < num_devices:
        counts.append(k)
        k *= 2
    return counts + [num_devices]


def share(groups: list[Any], engines: int) -> list[Any]:
    """Pure: one engine's share of the groups when `engines` engines split them."""
    return groups[:math.ceil(len(groups) / engines)]


def plan_placement(profiles: dict[str, StageProfile], num_devices: int, switch_s: float,
                   micro_batches: int) -> Placement:
    """rlinf-auto's plan on `num_devices` (one device per rank: the native engines')."""
    ctx = PlanContext(num_devices=num_devices, granularity={"rollout": 1}, work={}, switch_s=switch_s,
                      micro_batches=micro_batches, profiles=profiles)
    return RlinfAuto().place(ctx)


async def profile_components(wf: Any) -> tuple[dict[str, StageProfile], float]:
    """Times each component on this job's engines (module docstring); returns the
    profiles and the measured role switch."""
    ctl, cfg = wf.ctl, wf.cfg
    inits = wf.worker_inits(shared=set(COMPONENTS))  # time-sharing device 0: onload, work, offload
    for name in PROBE:
        ctl.channel(name, capacity=cfg.run.prompts_per_step + 2)
    async with contextlib.AsyncExitStack() as stack:
        async def started(cls: type, name: str, init: dict) -> WorkerGroup:
            group = await ctl.spawn(cls, name=name, devices=[0], init=init)
            stack.push_async_callback(ctl.stop_group, group)  # stopped however the profile ends
            return group
        async with asyncio.TaskGroup() as spawning:  # at once: a spawn is mostly a process start
            spawns = [spawning.create_task(started(wf.rollout_worker, "rollout~profile", inits["rollout"])),
                      spawning.create_task(started(InferenceWorker, "inference~profile",
                                                   dict(inits["inference"], with_ref=False))),
                      spawning.create_task(started(TrainerWorker, "trainer~profile", inits["trainer"]))]
        rollout, inference, trainer = (task.result() for task in spawns)
        batch = wf.prompts.groups(0)
        points, outputs = [], None
        await rollout.call(RolloutWorker.onload)
        for k in profile_counts(cfg.runtime.cluster.num_devices):
            seconds, done = await _timed_generate(ctl, rollout, share(batch, k), wf)
            points.append((k, seconds))
            outputs = outputs if outputs is not None else done
        begun = time.perf_counter()
        await rollout.call(RolloutWorker.offload)
        await inference.call(InferenceWorker.onload)
        switch_s = time.perf_counter() - begun
        inference_s, scored = await _timed_logprobs(ctl, inference, outputs)
        await inference.call(InferenceWorker.offload)
        await trainer.call(TrainerWorker.start, None)
        await trainer.call(TrainerWorker.onload)
        trained = experience.train_batch(scored, with_ref=False)
        begun = time.perf_counter()
        await trainer.call(TrainerWorker.train, trained.to_wire())
        trainer_s = time.perf_counter() - begun
    profiles = {"rollout": StageProfile(tuple(points)),
                "inference": StageProfile(((1, inference_s * (2 if cfg.with_ref else 1)),)),
                "trainer": StageProfile(((1, trainer_s),))}
    return profiles, switch_s


async def _timed_generate(ctl: Any, rollout: WorkerGroup, groups: list[dict], wf: Any) -> tuple[float, list[dict]]:
    prompts, rollouts = ctl.channel(PROBE[0]), ctl.channel(PROBE[1])
    for group in groups:
        await prompts.put(group)
    await prompts.put(END)
    begun = time.perf_counter()
    await rollout.call(RolloutWorker.generate, PROBE[0], PROBE[1], version=-1, chunk_size=len(groups),
                       sampling=wf.sampling())
    seconds = time.perf_counter() - begun
    done: list[dict] = []
    while len(done) < len(groups):
        done.extend(await rollouts.get())
    for group in done:
        for s in group.samples:
            s.reward = 0.0
    return seconds, done


async def _timed_logprobs(ctl: Any, inference: WorkerGroup, groups: list[dict]) -> tuple[float, list[dict]]:
    scored, experience_ = ctl.channel(PROBE[2]), ctl.channel(PROBE[3])
    await scored.put(groups, weight=len(groups))
    await scored.put(END)
    begun = time.perf_counter()
    await inference.call(InferenceWorker.compute_logprobs, PROBE[2], PROBE[3], version=-1)
    seconds = time.perf_counter() - begun
    out: list[dict] = []
    while len(out) < len(groups):
        out.extend(await experience_.get())
    return seconds, out


async def auto_placement(wf: Any) -> tuple[Placement, dict[str, Any]]:
    """The profile, then the plan; returns the placement and a report of both."""
    cfg = wf.cfg
    profiles, switch_s = await profile_components(wf)
    micro = max(1, cfg.run.prompts_per_step // cfg.rollout.chunk_size)
    placement = plan_placement(profiles, cfg.runtime.cluster.num_devices, switch_s, micro)
    report = {"profiles": {c: [list(p) for p in prof.points] for c, prof in profiles.items()},
              "switch_s": switch_s, "micro_batches": micro, "placement": placement.describe(),
              "devices": {c: placement.rank_devices(c) for c in profiles}}
    return placement, report
