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
(Sample.segments); a sample's version is its oldest, and a sample whose oldest token
would be more than algorithm.max_staleness versions behind the trainer that takes
it is generated again from its prompt (counted: regenerated_groups and _tokens, the
tokens dropped), so nothing is trained staler than the bound and nothing is dropped
unseen. (A tight bound has a price: a sample that needs more than about k + 1 steps'
rollout to decode is started again each time and never trained; the counters show
it.) A group is trained once (the ledger checks it). The rollout emits each finished
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
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynarl.components import experience
from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.base import InflightRequest
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.overlap import AHEAD
from dynarl.components.workflows.stages import stage
from dynarl.components.workflows.step_metrics import fixed_devices, step_metrics
from dynarl.core.files import atomic_open

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import GRPO

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


def resume_refused(checkpoint: str, oversample: float) -> str | None:
    """Why a run with rollout.oversample `oversample` cannot continue from `checkpoint`,
    or None: one that partial rollout carried groups across needs partial rollout."""
    if oversample > 1 or not os.path.exists(os.path.join(checkpoint, PARTIAL_FILE)):
        return None
    return (f"partial rollout carried unfinished groups across this checkpoint ({PARTIAL_FILE}): resume "
            "with its rollout.oversample (> 1), or they and the prompt stream's position are lost")


def complete(group: PromptGroup) -> bool:
    return all(s.finish for s in group.samples)


@dataclass(slots=True)
class PartialLive(LiveStep):
    """A partial step as a scheduler sees it: inference reads the batch from "ahead",
    and an inference rank joining the step ends once the batch is closed."""
    INPUT = {**LiveStep.INPUT, "inference": AHEAD}
    UPSTREAM = {**LiveStep.UPSTREAM, "inference": "closer"}


@dataclass(slots=True)
class Plan:
    """One step's groups: whole ones carried (trained first), and those to generate."""
    ready: list[PromptGroup]
    inflight: list[PromptGroup]
    kept: list[PromptGroup]
    """Whole groups beyond the batch (more than N finished late): carried on."""
    regenerated_groups: int
    regenerated_tokens: int


def plan(carry: list[PromptGroup], fresh: list[PromptGroup], step: int, num_groups: int,
         max_staleness: int) -> Plan:
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
    return Plan(ready, inflight, kept, regenerated_groups, regenerated_tokens)


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


class PartialSteps:
    def __init__(self, wf: "GRPO") -> None:
        self.wf = wf
        self.carry: list[PromptGroup] = []
        """Groups started and not yet trained (unfinished, or finished after a batch closed)."""
        self.stream = PromptStream(wf.prompts)

    async def step(self, step: int) -> dict[str, Any]:
        wf, cfg = self.wf, self.wf.cfg
        label = f"step {step}"
        started = time.perf_counter()
        n = cfg.run.prompts_per_step
        fresh = self.stream.take(max(0, n + extra_groups(cfg.rollout.oversample, n) - len(self.carry)))
        p = plan(self.carry, fresh, step, n, cfg.algorithm.max_staleness)
        need = n - len(p.ready)
        short = need - len(p.inflight)  # (a carry of whole groups beyond a batch): the batch must be able to close
        if short > 0:
            more = self.stream.take(short)
            for index, group in enumerate(more, start=len(p.ready) + len(p.inflight)):
                group.index = index
            p.inflight += more
        sched = wf.scheduling
        streaming = cfg.trainer.streaming
        live = wf.live = PartialLive(step, later=set() if streaming else {"trainer"})
        if sched is not None:  # the work it will train: N groups (of those in flight, the first)
            await sched.begin(live, (p.ready + p.inflight)[:n])
        rollout, reward = await wf.start_rollout(p.inflight, step, label, live)
        batch: list[PromptGroup] = []
        carried: list[PromptGroup] = list(p.kept)
        closer = live.done["closer"] = asyncio.ensure_future(self._close(step, p, need, batch, carried))
        g = wf.g
        # (through the LiveStep as the rollout's stage: on shared devices the locks are asked in this order)
        inference = live.joined("inference", stage(
            wf.ctl, g.inference, "compute_logprobs", get=AHEAD, put="experience", after=closer,
            gate=live.gates.get("inference"), clock=wf.clock, label=label, version=step, split=streaming))
        work = [closer, inference, rollout, reward]  # (results: in this order)
        if streaming:
            trainer = live.joined("trainer", stage(
                wf.ctl, g.trainer, "train_stream", get="experience", after=inference, gate=live.gates.get("trainer"),
                clock=wf.clock, label=label, with_ref=cfg.with_ref, behaviour=True))
            results = await wf._run_stages(live, label, [*work, trainer])
            trainer_stats = results[-1]
            trained = experience.Trained.merge(trainer_stats)
            train = trainer_stats[0]["metrics"]
            stats = {"trainer": trainer_stats}
        else:  # the barrier trainer steps once the batch is in (a scheduler may move devices to it first)
            results = await wf._run_stages(live, label, [*work, wf.collect(n)])
            live.later.clear()
            groups, _ = results[-1]
            trained = experience.Trained()
            trained.add(sorted(groups, key=lambda gr: gr.index))
            stats = {}
        ids = experience.sample_ids(batch)
        wf.check_trained(step, ids, trained)
        measured = {"rollout": results[2], "inference": results[1]}
        if not streaming:
            train_batch = wf.train_batch(groups, behaviour=True)
            train_devices, train_begun = len(wf.g.trainer.devices), time.perf_counter()
            train = await wf.train(train_batch, label)
            train_s = time.perf_counter() - train_begun
            tokens = sum(len(x) for x in train_batch.input_ids)
            measured["trainer"] = (train_devices, tokens / train_s) if train_s > 0 else None
        rollout_stats, reward_stats = results[2], results[3]
        self.carry = carried
        wf.commit_step(step, ids, trained)
        wf.stage_results = {"rollout": rollout_stats, "reward": reward_stats, "inference": results[1], **stats}
        if sched is None:
            devices = fixed_devices(g)
        else:
            rollout_end = wf.clock.last_end("rollout")
            train_end = wf.clock.last_end("trainer") if streaming else asyncio.get_running_loop().time()
            devices = await sched.end(label, rollout_end=rollout_end, train_end=train_end, measured=measured,
                                      last=step + 1 == cfg.run.steps)
        await wf.sync_weights(step + 1, label)
        return step_metrics(step, trained, train, rollout_stats, reward_stats, wf.clock.durations(label), time.perf_counter() - started) \
            | {"carried_groups": len(carried),
               "carried_unfinished": sum(1 for gr in carried for s in gr.samples if not s.finish),
               "carried_tokens": sum(len(s.output_ids) for gr in carried for s in gr.samples),
               "regenerated_groups": p.regenerated_groups, "regenerated_tokens": p.regenerated_tokens} \
            | devices | wf.fleet_metrics(step + 1)

    async def _close(self, step: int, p: Plan, need: int, batch: list[PromptGroup],
                     carried: list[PromptGroup]) -> None:
        """The batch to "ahead" for inference, as it forms: the whole carried groups,
        then the first `need` groups scored; at the `need`-th the rollout stops and its
        unfinished groups, with every group scored after, are carried."""
        wf = self.wf
        ahead = wf.ctl.channel(AHEAD)
        for group in p.ready:
            batch.append(group)
            await ahead.put([group])
        scored = wf.ctl.channel("scored")
        emitted: int | None = None  # groups the rollout emits in all: known once it stopped
        seen = 0
        while emitted is None or seen < emitted:
            for group in await scored.get():
                seen += 1
                if len(batch) - len(p.ready) < need:
                    batch.append(group)
                    await ahead.put([group])
                else:
                    carried.append(group)
            if emitted is None and len(batch) - len(p.ready) == need:
                emitted = len(p.inflight) - await self.wf.close_rollout(step, carried)

    # --- checkpoints ------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The carried groups and the stream's position, next to the checkpoint's trainer state."""
        with atomic_open(os.path.join(path, PARTIAL_FILE), sync=True) as f:
            json.dump({"format": 1, "stream": [self.stream.step, self.stream.offset],
                       "carry": [g.to_json() for g in self.carry]}, f)

    def load(self, path: str, step: int) -> None:
        """The checkpoint's carried groups and stream position (a checkpoint without them,
        taken before partial rollout was on: none carried, the stream at `step`)."""
        file = os.path.join(path, PARTIAL_FILE)
        if not os.path.exists(file):
            self.carry, self.stream = [], PromptStream(self.wf.prompts, step)
            return
        with open(file) as f:
            data = json.load(f)
        if data.get("format") != 1:
            raise ValueError(f"{file}: unknown format {data.get('format')!r}")
        self.carry = [PromptGroup.from_json(g) for g in data["carry"]]
        self.stream = PromptStream(self.wf.prompts, *data["stream"])


async def stop_generation(wf: "GRPO", step: int, carried: list[PromptGroup]) -> int:
    """Every rollout rank hands back its unfinished groups; their samples keep their
    tokens so far (made by `step`'s weights); they go to `carried`. Returns how many
    groups came back."""
    exported = 0
    # every rank generating for the step (with the dynarl scheduler, engines on lent
    # devices too: its rollout group is this one); no move meanwhile
    async with wf._busy("rollout"):
        per_rank = await wf.g.rollout.call("partial_close")
    for items in per_rank:
        for item in items:
            group = item["group"]
            by_id = {s.id: s for s in group.samples}
            for r in map(InflightRequest.from_wire, item["inflight"]):
                by_id[r.request.request_id].carry(r.output_token_ids, r.output_logprobs, step)
            carried.append(group)
            exported += 1
    return exported
