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
from dynarl.components.experience import END, PromptGroup, Sample
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.stages import stage
from dynarl.components.workflows.step_metrics import fixed_devices, step_metrics
from dynarl.core.files import atomic_open
from dynarl.core.worker_group import gather_or_cancel

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import GRPO

AHEAD = "ahead"
"""The channel the next step's reward stage fills (inference reads "scored")."""
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
        rollout, reward = await wf.start_rollout(groups, step, f"step {step}", LiveStep(step), version=version,
                                                 scored=AHEAD)
        (scored, _), rollout_stats, reward_stats = await gather_or_cancel(
            [wf.collect(len(groups), AHEAD), rollout, reward])
        return Generated(step, scored, rollout_stats, reward_stats)

    async def step(self, step: int) -> dict[str, Any]:
        wf, cfg = self.wf, self.wf.cfg
        label = f"step {step}"
        started = time.perf_counter()
        made = self.ahead if self.ahead is not None and self.ahead.step == step else None
        self.ahead = None
        if made is None:  # the first step, or the first after a resume without groups made ahead: on-policy
            made = await self.generate(step, version=step)
        following = None
        if step + 1 < cfg.run.steps:
            following = asyncio.ensure_future(self.generate(step + 1, version=step))
        try:
            train, trained, ids, stats = await self._train(step, made, label)
            if following is not None:
                self.ahead = await following
        except BaseException:
            if following is not None:
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
            raise
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
        scored = wf.ctl.channel("scored")
        for group in made.groups:
            await scored.put([group])  # a chunk of one group, as the reward stage puts them
        for _ in range(g.inference.world_size):
            await scored.put(END)
        streaming = wf.cfg.trainer.streaming
        inference = asyncio.ensure_future(stage(
            wf.ctl, g.inference, "compute_logprobs", get="scored", put="experience", clock=wf.clock, label=label,
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
        batch = experience.train_batch(groups, wf.cfg.with_ref, behaviour=True)
        return await wf.train(batch, label), trained, ids, {"inference": inference_stats}

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The groups made ahead, next to the checkpoint's trainer state."""
        if self.ahead is None:
            return
        with atomic_open(os.path.join(path, AHEAD_FILE), sync=True) as f:
            json.dump({"step": self.ahead.step, "groups": [_group_json(g) for g in self.ahead.groups],
                       "rollout_stats": self.ahead.rollout_stats, "reward_stats": self.ahead.reward_stats}, f)

    def load(self, path: str, step: int) -> None:
        """Groups made ahead for `step` (the checkpoint's next step), if it kept any."""
        file = os.path.join(path, AHEAD_FILE)
        self.ahead = None
        if not os.path.exists(file):
            return
        with open(file) as f:
            data = json.load(f)
        if data["step"] != step:
            raise ValueError(f"{file}: groups made for step {data['step']}, the checkpoint resumes at step {step}")
        groups = [PromptGroup.from_wire([g[0], g[1], g[2], g[3], [Sample.from_wire(s) for s in g[4]]])
                  for g in data["groups"]]
        self.ahead = Generated(step, groups, data["rollout_stats"], data["reward_stats"])


def _group_json(group: PromptGroup) -> list:
    return [group.index, group.problem, group.answer, list(group.prompt_ids),
            [[list(v) if isinstance(v, tuple) else v for v in s.to_wire()] for s in group.samples]]
