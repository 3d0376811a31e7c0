"""The batch source of DAPO's dynamic sampling (algorithm.dynamic_sampling, pipeline.py):
the step's N prompt groups generate as usual; a closer reads each scored group and
decides (dynamic_sampling.py decide): a group whose rewards differ goes to "ahead"
for inference and the trainer; one whose rewards are all equal is dropped, and while
the refill budget lasts the next prompt group of the stream goes to the still-running
rollout in its place. The rollout's ENDs go in once no more refills can come.

Nothing is dropped unseen: each step reports the groups dropped and refilled and the
batch's shortfall; its `reward_mean` is every scored sample's (kept or not: the
policy's reward on the prompts it met), `batch_reward_mean` the trained batch's. A
step that finds no group whose rewards differ within its budget trains its first
dropped group (advantages 0: no policy gradient), counted as `dynamic_uninformative`.

Prompts come from the stream in order (step t's groups, then t+1's); its position is
the source's state, kept with each checkpoint (partial.py's file, source "dynamic")."""
from __future__ import annotations

import asyncio
import json
import os
from typing import Any, Awaitable, Callable

from dynarl.components.experience import PromptGroup
from dynarl.components.stage_results import RewardStats, RolloutStats
from dynarl.components.workflows.dynamic_sampling import Tally, decide
from dynarl.components.workflows.live import LiveStep, SelectedLive
from dynarl.components.workflows.partial import PARTIAL_FILE, PromptStream
from dynarl.components.workflows.pipeline import AHEAD, Fresh, Opened, StartRollout
from dynarl.core.files import atomic_open

SOURCE = "dynamic"
"""This source's name in the stream file (partial.py resume_refused)."""


class Refilled(Fresh):
    live = SelectedLive

    def __init__(self, ctl: Any, prompts: Any, start: StartRollout, end: Callable[[], Awaitable[None]], *,
                 prompts_per_step: int, max_refills: int) -> None:
        """`start`: GRPO.start_rollout; `end`: puts the rollout ranks' ENDs on "prompts"."""
        self.ctl, self.prompts, self.start, self.end = ctl, prompts, start, end
        self.n, self.max_refills = prompts_per_step, max_refills
        self.stream = PromptStream(prompts)
        self.groups: list[PromptGroup] = []
        self.batch: list[PromptGroup] = []
        self.tally = Tally(need=prompts_per_step, budget=max_refills, outstanding=prompts_per_step)
        self.rewards: list[float] = []
        """Every scored sample's reward in the step."""
        self.uninformative = 0

    async def prepare(self, step: int) -> list[PromptGroup]:
        self.groups = self.stream.take(self.n)
        for index, group in enumerate(self.groups):
            group.index = index
        return self.groups

    async def open(self, step: int, label: str, live: LiveStep) -> Opened:
        self.tally = Tally(need=self.n, budget=self.max_refills, outstanding=self.n)
        self.batch, self.rewards, self.uninformative = [], [], 0
        rollout, reward = await self.start(self.groups, step, label, live, end=not self.tally.refilling)
        final = asyncio.get_running_loop().create_future()
        closer = live.done["closer"] = asyncio.ensure_future(self._close(final))
        return Opened([closer, rollout, reward], AHEAD, closer, self.batch, self.n, final=final)

    def stats(self, results: list[Any]) -> tuple[list[RolloutStats], list[RewardStats]]:
        return results[1], results[2]

    def done(self) -> dict[str, Any]:
        t = self.tally
        return {"dynamic_dropped_groups": t.dropped, "dynamic_refilled_groups": t.refilled,
                "dynamic_short_groups": t.need - len(self.batch), "dynamic_uninformative": self.uninformative,
                "reward_mean": sum(self.rewards) / len(self.rewards), "batch_reward_mean": self._batch_mean()}

    def _batch_mean(self) -> float:
        rewards = [s.reward for group in self.batch for s in group.samples]
        return sum(rewards) / len(rewards)

    async def _close(self, final: asyncio.Future) -> None:
        """Decides each scored group until none is outstanding; `final` gets the batch's size."""
        ahead, scored, prompts = self.ctl.channel(AHEAD), self.ctl.channel("scored"), self.ctl.channel("prompts")
        ended = not self.tally.refilling
        first_dropped: PromptGroup | None = None
        while not self.tally.closed:
            for group in await scored.get():
                self.rewards += [s.reward for s in group.samples]
                self.tally, verdict = decide(self.tally, [s.reward for s in group.samples])
                if verdict.keep:
                    self.batch.append(group)
                    await ahead.put([group])
                    continue
                if first_dropped is None:
                    first_dropped = group
                if verdict.refill:
                    (more,) = self.stream.take(1)
                    more.index = self.n + self.tally.refilled - 1
                    await prompts.put(more)
            if not ended and not self.tally.refilling:
                ended = True
                await self.end()
        if not self.batch and first_dropped is not None:  # nothing differed within the budget
            self.uninformative = 1
            self.batch.append(first_dropped)
            await ahead.put([first_dropped])
        final.set_result(len(self.batch))

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The stream's position, next to the checkpoint's trainer state."""
        with atomic_open(os.path.join(path, PARTIAL_FILE), sync=True) as f:
            json.dump({"format": 1, "source": SOURCE, "stream": [self.stream.step, self.stream.offset],
                       "carry": []}, f)

    def load(self, path: str, step: int) -> None:
        """The checkpoint's stream position (none kept: the stream at `step`)."""
        file = os.path.join(path, PARTIAL_FILE)
        if not os.path.exists(file):
            self.stream = PromptStream(self.prompts, step)
            return
        with open(file) as f:
            data = json.load(f)
        if data.get("format") != 1:
            raise ValueError(f"{file}: unknown format {data.get('format')!r}")
        self.stream = PromptStream(self.prompts, *data["stream"])
