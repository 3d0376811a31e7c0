"""Overlapped steps (algorithm.max_staleness 1): the rollout of the next step runs
while this step trains.

    step s:   rollout + reward of step s + 1, on the weights of step s   -> "ahead"
              inference + train of step s's batch (made during step s - 1) -> weights s + 1
              then both are done: the weights go to the rollout and inference ranks

So the rollout's devices and the trainer's work at the same time, and every sample
is trained one version after the weights that generated it (the first step's, and
the first after a resume, are generated in their own step: staleness 0). Inference
computes the step's old log-probs on the weights of step s, the proximal policy;
the rollout's own log-probs (the behaviour policy) go into the batch, and the loss
corrects for the difference (decoupled PPO, trainer/native/losses.py).

The next step's scored groups are a step's only state outside the trainer: each
checkpoint keeps them (AHEAD_FILE), so a resume trains them as they were generated,
neither lost nor regenerated on other weights.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynarl.components import experience
from dynarl.components.experience import END, PromptGroup
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.stages import stage
from dynarl.components.workflows.step_metrics import fixed_devices, step_metrics
from dynarl.core.files import atomic_open
from dynarl.core.worker_group import gather_or_cancel

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import GRPO

AHEAD = "ahead"
"""The channel inference reads the step's groups from, made ahead (the next step's
reward stage fills "scored" meanwhile, which this module reads itself)."""
AHEAD_FILE = "ahead.json"


@dataclass(slots=True)
class Generated:
    """One step's scored groups, made ahead, with the stage results of making them."""
    step: int
    groups: list[PromptGroup]
    rollout_stats: list[dict]
    reward_stats: list[dict]


class OverlappedSteps:
    def __init__(self, wf: "GRPO") -> None:
        self.wf = wf
        self.ahead: Generated | None = None
        """The next step's scored groups, once made (kept in checkpoints)."""

    async def generate(self, step: int, version: int) -> Generated:
        """Rollout and reward of `step`'s prompt groups on the weights `version` holds."""
        wf = self.wf
        groups = wf.prompts.groups(step)
        rollout, reward = await wf.start_rollout(groups, step, f"step {step}", LiveStep(step), version=version)
        scored, rollout_stats, reward_stats = await gather_or_cancel([self._scored(len(groups)), rollout, reward])
        return Generated(step, scored, rollout_stats, reward_stats)

    async def _scored(self, num_groups: int) -> list[PromptGroup]:
        groups: list[PromptGroup] = []
        while len(groups) < num_groups:
            groups += await self.wf.ctl.channel("scored").get()
        return groups

    async def step(self, step: int) -> dict[str, Any]:
        wf, cfg = self.wf, self.wf.cfg
        label = f"step {step}"
        started = time.perf_counter()
        made = self.ahead if self.ahead is not None and self.ahead.step == step else None
        self.ahead = None
        if made is None:  # the first step, or the first after a resume without groups made ahead: on-policy
            made = await self.generate(step, version=step)
        work = [asyncio.ensure_future(self._train(step, made, label))]
        if step + 1 < cfg.run.steps:
            work.append(asyncio.ensure_future(self.generate(step + 1, version=step)))
        try:  # the first failure, on either side, ends both (a lost rollout rank does not wait for the train)
            done, _ = await asyncio.wait(work, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            train, trained, ids, stats = work[0].result()  # no failure: both are done
            if len(work) > 1:
                self.ahead = work[1].result()
        finally:
            for task in work:
                task.cancel()
            await asyncio.gather(*work, return_exceptions=True)
        wf.commit_step(step, ids, trained)
        wf.stage_results = {"rollout": made.rollout_stats, "reward": made.reward_stats, **stats}
        await wf.sync_weights(step + 1, label)
        return step_metrics(step, trained, train, made.rollout_stats, made.reward_stats,
                            wf.clock.durations(label), time.perf_counter() - started) \
            | fixed_devices(wf.g) | wf.fleet_metrics(step + 1)

    async def _train(self, step: int, made: Generated, label: str
                     ) -> tuple[dict[str, float], experience.Trained, list[str], dict[str, list[dict]]]:
        """Inference (old log-probs on the weights of `step`: the proximal policy) and
        one train step over the groups made for `step` (a streaming trainer takes them
        as inference sends them). Returns the train metrics, what was trained, the
        sample ids, and the stages' per-rank results."""
        wf, g = self.wf, self.wf.g
        ahead = wf.ctl.channel(AHEAD)
        for group in made.groups:
            await ahead.put([group])  # a chunk of one group, as the reward stage puts them
        for _ in range(g.inference.world_size):
            await ahead.put(END)
        streaming = wf.cfg.trainer.streaming
        inference = asyncio.ensure_future(stage(
            wf.ctl, g.inference, "compute_logprobs", get=AHEAD, put="experience", clock=wf.clock, label=label,
            version=step, split=streaming))
        if streaming:
            trainer = stage(wf.ctl, g.trainer, "train_stream", get="experience", after=inference, clock=wf.clock,
                            label=label, with_ref=wf.cfg.with_ref, behaviour=True)
            inference_stats, trainer_stats = await gather_or_cancel([inference, trainer])
            trained = experience.Trained.merge(trainer_stats)
            ids = [s.id for group in sorted(made.groups, key=lambda gr: gr.index) for s in group.samples]
            wf.check_trained(step, ids, trained)
            return trainer_stats[0]["metrics"], trained, ids, {"inference": inference_stats, "trainer": trainer_stats}
        (groups, _), inference_stats = await gather_or_cancel([wf.collect(len(made.groups)), inference])
        ids = experience.sample_ids(groups)
        trained = experience.Trained()
        trained.add(sorted(groups, key=lambda g: g.index))
        wf.check_trained(step, ids, trained)
        batch = wf.train_batch(groups, behaviour=True)
        return await wf.train(batch, label), trained, ids, {"inference": inference_stats}

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The groups made ahead, next to the checkpoint's trainer state (none: no file,
        and none left from an earlier run in the same directory)."""
        file = os.path.join(path, AHEAD_FILE)
        if self.ahead is None:
            if os.path.exists(file):
                os.remove(file)
            return
        with atomic_open(file, sync=True) as f:
            json.dump({"format": 1, "step": self.ahead.step, "groups": [g.to_json() for g in self.ahead.groups],
                       "rollout_stats": self.ahead.rollout_stats, "reward_stats": self.ahead.reward_stats}, f)

    def load(self, path: str, step: int) -> None:
        """Groups made ahead for `step` (the checkpoint's next step), if it kept any."""
        file = os.path.join(path, AHEAD_FILE)
        self.ahead = None
        if not os.path.exists(file):
            return
        with open(file) as f:
            data = json.load(f)
        if data.get("format") != 1:
            raise ValueError(f"{file}: unknown format {data.get('format')!r}")
        if data["step"] != step:
            raise ValueError(f"{file}: groups made for step {data['step']}, the checkpoint resumes at step {step}")
        groups = [PromptGroup.from_json(g) for g in data["groups"]]
        self.ahead = Generated(step, groups, data["rollout_stats"], data["reward_stats"])

