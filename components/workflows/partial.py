"""Partial rollout (rollout.oversample > 1): more groups generate than a step
trains; the step closes its batch when enough have finished and carries the rest
into the next steps, their tokens so far kept.

    step s:  in flight = the groups carried unfinished from earlier steps (their
             samples continue from their tokens so far) + fresh prompts from the
             stream, N x oversample groups in all (N = run.prompts_per_step)
             the first N groups to be scored form the batch ("ahead": inference and
             the trainer take them as they come); at the N-th, every rollout rank
             stops at an engine-step boundary and hands back its unfinished groups
             groups scored after the N-th are whole: the next step trains them first

So no step waits for its longest samples: they continue in the next steps, on newer
weights. Every run of a sample's tokens records the version that made it
(Sample.segments); a sample's version is its oldest. A group in flight whose oldest
token would be more than algorithm.max_staleness versions behind the next step's
trainer is due: the step's batch keeps a place for each due group and closes only
once they are all in (so a long sample is waited for, never started again). Only
where the due groups outnumber the batch, or a checkpoint carried a group already
past the bound, is a sample generated again from its prompt (counted:
regenerated_groups and _tokens, the tokens dropped), so nothing is trained staler
than the bound and nothing is dropped unseen. A group is trained once (the ledger
checks it). The rollout emits each finished
group at once (chunks of one), so the batch closes on the N-th group to finish. The rollout's own
log-probs go into the batch, and the loss corrects for the older policies
(decoupled PPO, trainer/native/losses.py), as with overlapped steps.

Fresh prompts come from the prompt stream in order (step t's groups, then t+1's);
its position and the carried groups are a step's only state outside the trainer:
each checkpoint keeps them (PARTIAL_FILE), so a resume continues the same stream
with the same carried tokens, neither lost nor trained twice.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.run_control import Unfinished
from dynarl.components.stage_results import RewardStats, RolloutStats
from dynarl.components.workflows.live import LiveStep, SelectedLive
from dynarl.components.workflows.pipeline import AHEAD, Fresh, Opened, StartRollout
from dynarl.core.files import atomic_open

PARTIAL_FILE = "partial.json"


def extra_groups(oversample: float, prompts_per_step: int) -> int:
    """Groups generated beyond a step's batch: floor((oversample - 1) x N)."""
    return math.floor((oversample - 1.0) * prompts_per_step + 1e-9)


def sample_oldest(sample: Sample) -> int | None:
    """The oldest weight version that made any of the sample's tokens (None: none made)."""
    if sample.finish:
        return sample.version
    return min((v for _, _, v in sample.segments or ()), default=None)


def oldest_version(group: PromptGroup) -> int | None:
    """The oldest weight version that made any of the group's tokens (None: none made)."""
    return min((v for s in group.samples if (v := sample_oldest(s)) is not None), default=None)


def stream_source(cfg: Any) -> str | None:
    """The batch source whose prompt stream runs ahead of the steps under `cfg` (its
    position is kept in PARTIAL_FILE): "partial" (rollout.oversample > 1), "dynamic"
    (algorithm.dynamic_sampling, refill.py), or None (each step takes its own groups)."""
    if cfg.rollout.oversample > 1:
        return "partial"
    return "dynamic" if cfg.algorithm.dynamic_sampling else None


def resume_refused(checkpoint: str, source: str | None) -> str | None:
    """Why a run whose stream source is `source` (stream_source) cannot continue from
    `checkpoint`, or None: a checkpoint whose prompt stream ran ahead needs the source
    that kept it."""
    file = os.path.join(checkpoint, PARTIAL_FILE)
    if not os.path.exists(file):
        return None
    try:
        with open(file) as f:
            kept = json.load(f).get("source", "partial")
    except (OSError, ValueError, AttributeError):
        kept = "partial"
    if kept == source:
        return None
    if kept == "dynamic":
        return (f"dynamic sampling moved the prompt stream ahead of its steps across this checkpoint "
                f"({PARTIAL_FILE}): resume with algorithm.dynamic_sampling true, or prompts already trained "
                "come again")
    return (f"partial rollout carried unfinished groups across this checkpoint ({PARTIAL_FILE}): resume "
            "with its rollout.oversample (> 1), or they and the prompt stream's position are lost")


def complete(group: PromptGroup) -> bool:
    return all(s.finish for s in group.samples)


def group_key(group: PromptGroup) -> str:
    """A group's identity across processes: its first sample's id."""
    return group.samples[0].id


def due(groups: list[PromptGroup], step: int, max_staleness: int) -> set[str]:
    """Pure: the keys of the groups that step `step` must train: carried on to step
    + 1, their oldest token would be more than `max_staleness` versions behind."""
    return {group_key(g) for g in groups
            if (v := oldest_version(g)) is not None and step + 1 - v > max_staleness}


def takes(is_due: bool, taken: int, due_left: int, need: int) -> bool:
    """Pure: whether the batch takes a scored group, holding `taken` of the `need`
    groups it closes on, with `due_left` due groups (not this one) still to come: a
    due group while there is room; another only where it leaves a place for each due
    group still to come."""
    if is_due:
        return taken < need
    return taken + due_left < need


@dataclass(slots=True)
class StepGroups:
    """One step's groups: whole ones carried (trained first), and those to generate."""
    ready: list[PromptGroup]
    inflight: list[PromptGroup]
    kept: list[PromptGroup]
    """Whole groups beyond the batch (more than N finished late): carried on."""
    regenerated_groups: int
    regenerated_tokens: int


def plan(carry: list[PromptGroup], fresh: list[PromptGroup], step: int, num_groups: int,
         max_staleness: int) -> StepGroups:
    """Pure: the step's whole groups (oldest first, at most `num_groups` - 1: every
    step generates, so its rollout stage, and a scheduler's view of it, exist), then the
    groups to generate: the carried unfinished ones, then `fresh`. A carried sample
    whose oldest token would be trained more than `max_staleness` versions late starts
    again from its prompt (its group's other samples stay). Indices are renumbered:
    each group's position in the step."""
    regenerated_groups = regenerated_tokens = 0
    for g in carry:
        stale = [s for s in g.samples if (v := sample_oldest(s)) is not None and step - v > max_staleness]
        if stale:
            regenerated_groups += 1
            regenerated_tokens += sum(len(s.output_ids) for s in stale)
            for s in stale:
                s.restart()
    whole = sorted((g for g in carry if complete(g)), key=lambda g: (oldest_version(g), g.samples[0].id))
    ready, kept = whole[:num_groups - 1], whole[num_groups - 1:]  # a step always generates one group at least
    inflight = [g for g in carry if not complete(g)] + fresh
    for index, g in enumerate(ready + inflight):
        g.index = index
    return StepGroups(ready, inflight, kept, regenerated_groups, regenerated_tokens)


class PromptStream:
    """The prompt groups of step 0, 1, 2, ... in order, taken a few at a time."""

    def __init__(self, prompts: Any, step: int = 0, offset: int = 0) -> None:
        self.prompts, self.step, self.offset = prompts, step, offset
        self._groups: list[PromptGroup] | None = None

    def take(self, n: int) -> list[PromptGroup]:
        out: list[PromptGroup] = []
        while len(out) < n:
            if self._groups is None:
                self._groups = self.prompts.groups(self.step)
                if not self._groups:
                    raise ValueError(f"rollout.oversample: the prompt stream has no groups at step {self.step}")
            chunk = self._groups[self.offset:self.offset + n - len(out)]
            out += chunk
            self.offset += len(chunk)
            if self.offset >= len(self._groups):
                self.step, self.offset, self._groups = self.step + 1, 0, None
        return out


class Partial(Fresh):
    """The batch source of partial rollout (pipeline.py): the first N of the groups in
    flight to be scored; the rest are carried."""
    behaviour, timed, live = True, False, SelectedLive

    def __init__(self, ctl: Any, prompts: Any, start: StartRollout,
                 close: Callable[[int, list[PromptGroup]], Awaitable[int]], *, prompts_per_step: int,
                 oversample: float, max_staleness: int) -> None:
        self.ctl, self.prompts, self.start, self.close = ctl, prompts, start, close
        self.n, self.max_staleness = prompts_per_step, max_staleness
        self.extra = extra_groups(oversample, prompts_per_step)
        self.carry: list[PromptGroup] = []
        """Groups started and not yet trained (unfinished, or finished after a batch closed)."""
        self.stream = PromptStream(prompts)
        self.step_groups: StepGroups | None = None
        self.batch: list[PromptGroup] = []
        self.carried: list[PromptGroup] = []

    async def prepare(self, step: int) -> list[PromptGroup]:
        """The step's groups; the work it will train: N groups (of those in flight, the first)."""
        n = self.n
        fresh = self.stream.take(max(0, n + self.extra - len(self.carry)))
        p = self.step_groups = plan(self.carry, fresh, step, n, self.max_staleness)
        short = n - len(p.ready) - len(p.inflight)  # (a carry of whole groups beyond a batch): the batch must close
        if short > 0:
            more = self.stream.take(short)
            for index, group in enumerate(more, start=len(p.ready) + len(p.inflight)):
                group.index = index
            p.inflight += more
        return (p.ready + p.inflight)[:n]

    async def open(self, step: int, label: str, live: LiveStep) -> Opened:
        p = self.step_groups
        rollout, reward = await self.start(p.inflight, step, label, live)
        self.batch, self.carried = [], list(p.kept)
        closer = live.done["closer"] = asyncio.ensure_future(self._close(step, p, self.n - len(p.ready)))
        return Opened([closer, rollout, reward], AHEAD, closer, self.batch, self.n)

    def stats(self, results: list[Any]) -> tuple[list[RolloutStats], list[RewardStats]]:
        return results[1], results[2]

    def done(self) -> dict[str, Any]:
        """The step's batch is trained: the groups left over are carried."""
        carried, p = self.carried, self.step_groups
        self.carry = carried
        return {"carried_groups": len(carried),
                "carried_unfinished": sum(1 for gr in carried for s in gr.samples if not s.finish),
                "carried_tokens": sum(len(s.output_ids) for gr in carried for s in gr.samples),
                "regenerated_groups": p.regenerated_groups, "regenerated_tokens": p.regenerated_tokens}

    async def _close(self, step: int, p: StepGroups, need: int) -> None:
        """The batch to "ahead" for inference, as it forms: the whole carried groups,
        then the first `need` groups scored, a place kept for each due group (due);
        at the `need`-th the rollout stops and its unfinished groups, with every group
        scored after, are carried."""
        batch, carried = self.batch, self.carried
        ahead = self.ctl.channel(AHEAD)
        for group in p.ready:
            batch.append(group)
            await ahead.put([group])
        scored = self.ctl.channel("scored")
        waiting = due(p.inflight, step, self.max_staleness)  # places kept in the batch for these
        emitted: int | None = None  # groups the rollout emits in all: known once it stopped
        seen = 0
        while emitted is None or seen < emitted:
            for group in await scored.get():
                seen += 1
                key = group_key(group)
                is_due = key in waiting
                waiting.discard(key)
                if takes(is_due, len(batch) - len(p.ready), len(waiting), need):
                    batch.append(group)
                    await ahead.put([group])
                else:
                    carried.append(group)
            if emitted is None and len(batch) - len(p.ready) == need:
                emitted = len(p.inflight) - await self.close(step, carried)

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The carried groups and the stream's position, next to the checkpoint's trainer state."""
        with atomic_open(os.path.join(path, PARTIAL_FILE), sync=True) as f:
            json.dump({"format": 1, "source": "partial", "stream": [self.stream.step, self.stream.offset],
                       "carry": [g.to_json() for g in self.carry]}, f)

    def load(self, path: str, step: int) -> None:
        """The checkpoint's carried groups and stream position (a checkpoint without them,
        taken before partial rollout was on: none carried, the stream at `step`)."""
        file = os.path.join(path, PARTIAL_FILE)
        if not os.path.exists(file):
            self.carry, self.stream = [], PromptStream(self.prompts, step)
            return
        with open(file) as f:
            data = json.load(f)
        if data.get("format") != 1:
            raise ValueError(f"{file}: unknown format {data.get('format')!r}")
        self.carry = [PromptGroup.from_json(g) for g in data["carry"]]
        self.stream = PromptStream(self.prompts, *data["stream"])


def take_back(per_rank: list[list[Unfinished]], step: int, carried: list[PromptGroup]) -> int:
    """The rollout ranks' unfinished groups (RolloutWorker.partial_close's results) go
    to `carried`, their samples keeping their tokens so far (made by `step`'s weights).
    Returns how many."""
    exported = 0
    for items in per_rank:
        for item in items:
            group = item.group
            by_id = {s.id: s for s in group.samples}
            for r in item.inflight:
                by_id[r.request.request_id].carry(r.output_token_ids, r.output_logprobs, step)
            carried.append(group)
            exported += 1
    return exported
