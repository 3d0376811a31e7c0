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
from dataclasses import asdict, dataclass, fields
from typing import Any, Awaitable, Callable

from dynarl.components.experience import END, PromptGroup
from dynarl.components.stage_results import RewardStats, RolloutStats
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.pipeline import AHEAD, Fresh, Opened, StartRollout, StepResult
from dynarl.core.files import atomic_open
from dynarl.core.worker_group import gather_or_cancel

AHEAD_FILE = "ahead.json"


@dataclass(slots=True)
class Generated:
    """One step's scored groups, made ahead, with the stage results of making them."""
    step: int
    groups: list[PromptGroup]
    rollout_stats: list[RolloutStats]
    reward_stats: list[RewardStats]


class MadeAhead(Fresh):
    """The batch source of overlapped steps (pipeline.py): the groups the step before
    made, while the next step's are made beside the step's inference and train."""
    behaviour, joins, timed = True, False, False

    def __init__(self, ctl: Any, prompts: Any, start: StartRollout, steps: int,
                 inference_ranks: Callable[[], int]) -> None:
        self.ctl, self.prompts, self.start, self.steps = ctl, prompts, start, steps
        self.inference_ranks = inference_ranks
        self.ahead: Generated | None = None
        """The next step's scored groups, once made (kept in checkpoints)."""
        self.made: Generated | None = None
        """The step's own."""

    async def generate(self, step: int, version: int) -> Generated:
        """Rollout and reward of `step`'s prompt groups on the weights `version` holds."""
        groups = self.prompts.groups(step)
        rollout, reward = await self.start(groups, step, f"step {step}", LiveStep(step), version=version)
        scored, rollout_stats, reward_stats = await gather_or_cancel([self._scored(len(groups)), rollout, reward])
        return Generated(step, scored, rollout_stats, reward_stats)

    async def _scored(self, num_groups: int) -> list[PromptGroup]:
        groups: list[PromptGroup] = []
        while len(groups) < num_groups:
            groups += await self.ctl.channel("scored").get()
        return groups

    async def prepare(self, step: int) -> list[PromptGroup]:
        made = self.ahead if self.ahead is not None and self.ahead.step == step else None
        self.ahead = None
        if made is None:  # the first step, or the first after a resume without groups made ahead: on-policy
            made = await self.generate(step, version=step)
        self.made = made
        return made.groups

    async def open(self, step: int, label: str, live: LiveStep) -> Opened:
        """The groups made for `step` go to inference (old log-probs on the weights of
        `step`: the proximal policy)."""
        ahead = self.ctl.channel(AHEAD)
        for group in self.made.groups:
            await ahead.put([group])  # a chunk of one group, as the reward stage puts them
        for _ in range(self.inference_ranks()):
            await ahead.put(END)
        return Opened([], AHEAD, None, self.made.groups, len(self.made.groups))

    def stats(self, results: list[Any]) -> tuple[list[RolloutStats], list[RewardStats]]:
        return self.made.rollout_stats, self.made.reward_stats

    async def beside(self, step: int, body: Awaitable[StepResult]) -> StepResult:
        """The step's inference and train, and the next step's rollout and reward on the
        weights of `step`."""
        work = [asyncio.ensure_future(body)]
        if step + 1 < self.steps:
            work.append(asyncio.ensure_future(self.generate(step + 1, version=step)))
        try:  # the first failure, on either side, ends both (a lost rollout rank does not wait for the train)
            done, _ = await asyncio.wait(work, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            if len(work) > 1:  # no failure: both are done
                self.ahead = work[1].result()
            return work[0].result()
        finally:
            for task in work:
                task.cancel()
            await asyncio.gather(*work, return_exceptions=True)

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
                       "rollout_stats": [asdict(r) for r in self.ahead.rollout_stats],
                       "reward_stats": [asdict(r) for r in self.ahead.reward_stats]}, f)

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
        self.ahead = Generated(step, groups, [_kept(RolloutStats, r) for r in data["rollout_stats"]],
                               [_kept(RewardStats, r) for r in data["reward_stats"]])


def _kept(cls: type, data: dict[str, Any]) -> Any:
    """A stage result as ahead.json keeps it (a key of an older file's that is no field, dropped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})

