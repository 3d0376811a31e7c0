"""Overlapped steps (algorithm.max_staleness k >= 1, rollout.oversample 1): the
rollout runs up to k steps ahead of the trainer.

    step s:   rollout + reward of the steps after s not yet made, up to s + k, one
              after the other on the weights of step s                  -> "ahead"
              inference + train of step s's batch (made during an earlier step)
              -> weights s + 1; then both are done: the weights go to the rollout
              and inference ranks

So the rollout's devices and the trainer's work at the same time, and a batch made
during step s is trained at most k versions after the weights that generated it (the
first step's, and the first after a resume, are generated in their own step:
staleness 0; with k > 1 the first step makes steps 1 to k, then each step makes one,
k versions behind). Inference computes the step's old log-probs on the weights of
step s, the proximal policy; the rollout's own log-probs (the behaviour policy) go
into the batch, and the loss corrects for the difference (decoupled PPO,
trainer/native/losses.py).

The batches made ahead are a step's only state outside the trainer: each checkpoint
keeps them (AHEAD_FILE), so a resume trains them as they were generated, neither
lost nor regenerated on other weights.
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
                 inference_ranks: Callable[[], int], depth: int = 1) -> None:
        self.ctl, self.prompts, self.start, self.steps = ctl, prompts, start, steps
        self.inference_ranks, self.depth = inference_ranks, depth
        self.ahead: list[Generated] = []
        """The later steps' scored groups, once made, in step order (kept in checkpoints)."""
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
        made = self.ahead.pop(0) if self.ahead and self.ahead[0].step == step else None
        if made is None:  # the first step, or the first after a resume without groups made ahead: on-policy
            self.ahead = []
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

    def to_make(self, step: int) -> range:
        """Pure: the steps whose batches step `step` makes: those after the last made,
        up to `step` + depth, within the run."""
        first = self.ahead[-1].step + 1 if self.ahead else step + 1
        return range(first, min(step + self.depth, self.steps - 1) + 1)

    async def _make(self, steps: range, version: int) -> list[Generated]:
        return [await self.generate(s, version=version) for s in steps]

    async def beside(self, step: int, body: Awaitable[StepResult]) -> StepResult:
        """The step's inference and train, and the later steps' rollout and reward on
        the weights of `step` (to_make)."""
        work = [asyncio.ensure_future(body)]
        if steps := self.to_make(step):
            work.append(asyncio.ensure_future(self._make(steps, step)))
        try:  # the first failure, on either side, ends both (a lost rollout rank does not wait for the train)
            done, _ = await asyncio.wait(work, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            if len(work) > 1:  # no failure: both are done
                self.ahead += work[1].result()
            return work[0].result()
        finally:
            for task in work:
                task.cancel()
            await asyncio.gather(*work, return_exceptions=True)

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The batches made ahead, next to the checkpoint's trainer state (none: no
        file, and none left from an earlier run in the same directory)."""
        file = os.path.join(path, AHEAD_FILE)
        if not self.ahead:
            if os.path.exists(file):
                os.remove(file)
            return
        with atomic_open(file, sync=True) as f:
            json.dump({"format": 2, "batches": [_saved(made) for made in self.ahead]}, f)

    def load(self, path: str, step: int) -> None:
        """The batches made ahead from `step` (the checkpoint's next step) on, if it
        kept any (format 1: one batch, the next step's)."""
        file = os.path.join(path, AHEAD_FILE)
        self.ahead = []
        if not os.path.exists(file):
            return
        with open(file) as f:
            data = json.load(f)
        if data.get("format") not in (1, 2):
            raise ValueError(f"{file}: unknown format {data.get('format')!r}")
        batches = [_loaded(b) for b in (data["batches"] if data["format"] == 2 else [data])]
        if [b.step for b in batches] != list(range(step, step + len(batches))):
            raise ValueError(f"{file}: batches made for steps {[b.step for b in batches]}, the checkpoint "
                             f"resumes at step {step}")
        self.ahead = batches


def _saved(made: Generated) -> dict[str, Any]:
    return {"step": made.step, "groups": [g.to_json() for g in made.groups],
            "rollout_stats": [asdict(r) for r in made.rollout_stats],
            "reward_stats": [asdict(r) for r in made.reward_stats]}


def _loaded(data: dict[str, Any]) -> Generated:
    return Generated(data["step"], [PromptGroup.from_json(g) for g in data["groups"]],
                     [_kept(RolloutStats, r) for r in data["rollout_stats"]],
                     [_kept(RewardStats, r) for r in data["reward_stats"]])


def _kept(cls: type, data: dict[str, Any]) -> Any:
    """A stage result as ahead.json keeps it (a key of an older file's that is no field, dropped)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})

