"""One step of GRPO (PPO's, the agentic workflow's), whatever its mode: a batch
source composed with a trainer mode, and one ending.

    source     Fresh: the step's own prompt groups, generated in it; MadeAhead (overlap.py):
               generated in the step before; Partial (partial.py): the first N to finish
    inference  the source's channel -> "experience": old (and reference) log-probs
    trainer    barrier: one train call on the collected batch after the stages;
               streaming (trainer.streaming): a stage taking samples as inference sends them
    ending     the ledger commit, the scheduler's end (policy dynarl), the weight sync, the metrics
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from dynarl.components import experience
from dynarl.components.experience import PromptGroup
from dynarl.components.reward.outcome import Tally
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.stage_results import InferenceStats, RewardStats, RolloutStats, TrainerStats
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import jsonl
from dynarl.components.workflows.ledger import SampleLedger
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.sample_text import TEXT_FILE, step_samples
from dynarl.components.workflows.stages import stage
from dynarl.components.workflows.step_metrics import fixed_devices, step_metrics
from dynarl.core.worker_group import gather_or_cancel

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import GRPO

log = logging.getLogger(__name__)


@dataclass(slots=True)
class StageStats:
    """A step's per-rank stage results, as the ranks' workers return them."""
    rollout: list[RolloutStats]
    reward: list[RewardStats]
    inference: list[InferenceStats] = field(default_factory=list)
    trainer: list[TrainerStats] | None = None
    """A streaming trainer's ranks' (None: a barrier trainer, whose one call is no stage)."""

    def busy(self) -> dict[str, list[tuple[list[list[float]], int | None]]]:
        """Each rank's busy intervals and the devices it spans (None: its component's
        unit), by device stage that ran (reward's runs on no device)."""
        out = {"rollout": [(r.busy, r.devices) for r in self.rollout],
               "inference": [(r.busy, None) for r in self.inference]}
        return out if self.trainer is None else out | {"trainer": [(r.busy, None) for r in self.trainer]}

    @property
    def episodes(self) -> dict[str, Any]:
        """The agentic reward stage's episode counts (agentic.py driver_metrics)."""
        return self.reward[0].episodes


@dataclass(slots=True)
class StepResult:
    """What a step's stages and train produced, before its ending."""
    ids: list[str]
    """The batch's sample ids, in canonical order."""
    trained: experience.Trained
    train: TrainMetrics
    stats: StageStats
    first_input: float | None
    """Loop time the trainer's first input came (pipelining: before the rollout ended?)."""
    trainer_rate: tuple[int, float] | None
    """A barrier train's devices and tokens/s (the scheduler learns it)."""
    batch: TrainBatch | None = None
    """What a barrier trainer was given (run.save_samples keeps it)."""
    groups: list[PromptGroup] | None = None
    """A barrier trainer's groups (run.log_samples writes some as text)."""


@dataclass(slots=True)
class Opened:
    """What a source started: its stages, and where inference reads."""
    work: list[asyncio.Future]
    inbox: str
    after: asyncio.Future | None
    """Inference's input ends when it is done (None: its ENDs are in already)."""
    batch: list[PromptGroup]
    """The `size` groups the step trains (partial: filled while the stages run)."""
    size: int
    final: asyncio.Future | None = None
    """The batch's size once known, where it may end below `size` (dynamic sampling)."""


AHEAD = "ahead"
"""The channel inference reads a batch made ahead from (overlap.py, partial.py)."""
StartRollout = Callable[..., Awaitable[tuple[asyncio.Future, asyncio.Future]]]


class Fresh:
    """A batch source: each step's own prompt groups, generated in the step (on-policy).
    The other sources (overlap.py, partial.py) derive from it."""
    behaviour = False
    """Batches carry the rollout's own log-probs (older weights made them)."""
    joins = timed = True
    """Its stages join the LiveStep (a scheduler may add ranks); the step reports
    first_chunk_s and rollout_end_s."""
    live: type[LiveStep] = LiveStep

    def __init__(self, prompts: Any, start: StartRollout) -> None:
        self.prompts, self.start = prompts, start
        self.groups: list[PromptGroup] = []

    async def prepare(self, step: int) -> list[PromptGroup]:
        """The groups the step will train (a scheduler's view of its work)."""
        self.groups = self.prompts.groups(step)
        return self.groups

    async def open(self, step: int, label: str, live: LiveStep) -> Opened:
        rollout, reward = await self.start(self.groups, step, label, live)
        return Opened([rollout, reward], "scored", reward, self.groups, len(self.groups))

    def stats(self, results: list[Any]) -> tuple[list[RolloutStats], list[RewardStats]]:
        """The rollout's and reward's per-rank results, of `results` (of Opened.work)."""
        return results[0], results[1]

    async def beside(self, step: int, body: Awaitable[StepResult]) -> StepResult:
        """Runs the step's `body` (and what the source does meanwhile)."""
        return await body

    def done(self) -> dict[str, Any]:
        """The step is trained; the source's metrics."""
        return {}

    def save(self, path: str) -> None:
        """Nothing outside the trainer to keep."""

    def load(self, path: str, step: int) -> None:
        """Nothing to restore."""


def check_trained(ledger: SampleLedger, step: int, ids: list[str], trained: experience.Trained) -> None:
    """Every sample of the step's batch was trained exactly once, and none before."""
    if len(trained.ids) != len(ids) or set(trained.ids) != set(ids):
        raise RuntimeError(f"step {step}: the trainer took {len(trained.ids)} samples "
                           f"({len(set(trained.ids))} distinct), the batch has {len(ids)}")
    ledger.check(step, ids)


class StepPipeline:
    def __init__(self, host: "GRPO", source: Fresh) -> None:
        self.host, self.source = host, source
        self.live: LiveStep | None = None
        """The step in progress (or the last one)."""
        self.stats: StageStats | None = None
        """The last step's stage results."""

    async def begin(self, step: int) -> LiveStep:
        """The step's groups are chosen, lost ranks replaced (survival.py) and the
        scheduler told what the step will train."""
        h, source = self.host, self.source
        groups = await source.prepare(step)
        if h.survival is not None:
            await h.survival.replace_lost(step)
        live = self.live = source.live(step, later=set() if h.cfg.trainer.streaming else {"trainer"})
        if h.scheduling is not None:
            await h.scheduling.begin(live, groups)
        return live

    async def stages(self, step: int, label: str, live: LiveStep) -> StepResult:
        """The source's stages, inference and the trainer (a stage, or a call on the
        collected batch after them)."""
        h, source, streaming = self.host, self.source, self.host.cfg.trainer.streaming
        opened = await source.open(step, label, live)
        inference = self._inference(live, opened, label, step, streaming)  # None: no inference stage
        trainer_in = opened.inbox if inference is None else "experience"
        work = [*opened.work] if inference is None else [*opened.work, inference]
        if streaming:  # (always after an inference stage, which splits the chunks: old_logprobs.py)
            trainer = self._stage(live, "trainer", stage(
                h.ctl, h.g.trainer, TrainerWorker.train_stream, get="experience", after=inference,
                gate=live.gates.get("trainer"), clock=h.clock, label=label, with_ref=h.cfg.with_ref,
                behaviour=h.behaviour))
            *results, inference_stats, trainer_stats = await self.run_stages(live, label, [*work, trainer])
            trained = experience.Trained.merge([r.trained for r in trainer_stats])
            train = trainer_stats[0].metrics
            starts = [r.busy[0][0] for r in trainer_stats if r.busy]
            first, rate = min(starts) if starts else None, None
        else:
            *results, (groups, first) = await self.run_stages(
                live, label, [*work, self.collect(opened.size, opened.final, trainer_in)])
            inference_stats = results.pop() if inference is not None else []
            live.later.clear()
            trained, trainer_stats = experience.Trained(), None
            trained.add(sorted(groups, key=lambda gr: gr.index))
        ids = experience.sample_ids(opened.batch)
        check_trained(h.ledger, step, ids, trained)
        if not streaming:  # the barrier trainer's one step on the batch
            batch = h.train_batch(groups, behaviour=h.behaviour)
            devices, begun = len(h.g.trainer.devices), time.perf_counter()
            train = await h.train(batch, label)
            train_s = time.perf_counter() - begun
            tokens = sum(len(x) for x in batch.input_ids)
            rate = (devices, tokens * h.trainer_passes / train_s) if train_s > 0 else None
        stats = StageStats(*source.stats(results), inference_stats, trainer_stats)
        return StepResult(ids, trained, train, stats, first, rate, None if streaming else batch,
                          None if streaming else groups)

    async def end(self, step: int, label: str, result: StepResult, started: float, begun: float) -> dict[str, Any]:
        """The one ending of every step: the ledger commit, the scheduler's end (its
        metrics), the weight sync, the step's metrics row."""
        h, stats, sched = self.host, result.stats, self.host.scheduling
        extra = self.source.done()
        h.commit_step(step, result.ids, result.trained)
        if h.cfg.run.save_samples and h.run_dir is not None and result.batch is not None:
            jsonl.append(os.path.join(h.run_dir, SAMPLES_FILE), trained_samples(step, result.ids, result.batch))
        if h.cfg.run.log_samples and h.run_dir is not None and result.groups is not None:
            jsonl.append(os.path.join(h.run_dir, TEXT_FILE),
                         step_samples(step, result.groups, h.tokenizer, h.cfg.run.log_samples))
        self.stats = stats
        timed: dict[str, float] = {}
        if self.source.timed:
            first = begun if result.first_input is None else result.first_input
            timed = {"first_chunk_s": first - begun, "rollout_end_s": h.clock.last_end("rollout") - begun}
        if sched is None:
            devices = fixed_devices(h.g)
        else:
            measured: dict[str, Any] = {"rollout": stats.rollout, "inference": stats.inference}
            if stats.trainer is None:
                measured["trainer"] = result.trainer_rate
            train_end = asyncio.get_running_loop().time() if stats.trainer is None else h.clock.last_end("trainer")
            devices = await sched.end(label, rollout_end=h.clock.last_end("rollout"), train_end=train_end,
                                      measured=measured, last=step + 1 == h.cfg.run.steps)
        await h.sync_weights(step + 1, label)
        failed = Tally.of_ranks(stats.reward).summary(sum(r.samples for r in stats.reward))
        if failed is not None:  # one line a step, over every reward rank
            log.warning("%s", failed)
        return step_metrics(step, result.trained, result.train, stats.rollout, stats.reward,
                            h.clock.durations(label), time.perf_counter() - started, with_kl=h.cfg.with_ref,
                            inference_stats=stats.inference, rollout_backend=h.cfg.rollout.backend) \
            | timed | extra | devices | h.fleet_metrics(step + 1)

    def _inference(self, live: LiveStep, opened: Opened, label: str, step: int, streaming: bool
                   ) -> asyncio.Future | None:
        """The inference stage on the source's channel (old and reference log-probs, onto
        "experience"); None where the trainer's forward gives the old log-probs and
        nothing else is asked of it (inference.old_logprobs auto: old_logprobs.py)."""
        h = self.host
        if h.inference_pass is None:
            return None
        kw = dict(after=opened.after, gate=live.gates.get("inference"), clock=h.clock, label=label, version=step,
                  split=streaming, ranks_call=None if h.survival is None else h.survival.stage_call("inference", True))
        if opened.inbox == "scored":  # (literal channels: the static hypergraph reads them, launch/graph.py)
            work = stage(h.ctl, h.g.inference, InferenceWorker.compute_logprobs, get="scored", put="experience", **kw)
        else:
            work = stage(h.ctl, h.g.inference, InferenceWorker.compute_logprobs, get=AHEAD, put="experience", **kw)
        return self._stage(live, "inference", work)

    def _stage(self, live: LiveStep, component: str, work: Awaitable[list[Any]]) -> asyncio.Future:
        return live.joined(component, work) if self.source.joins else asyncio.ensure_future(work)

    async def run_stages(self, live: LiveStep, label: str, stages: list[Any]) -> list[Any]:
        """The step's stages to their end, the scheduler ticking beside them (policy
        dynarl; before a barrier trainer's turn it decides once more); a failure stops
        the scheduler and is raised."""
        sched = self.host.scheduling
        try:
            if sched is not None:
                sched.start(live, label)
            results = await gather_or_cancel(stages)
            if sched is not None and live.later:
                await sched.rollout_done()
            return results
        except BaseException:
            if sched is not None:
                await sched.stop(raise_failure=False)
            raise

    async def collect(self, num_groups: int, final: asyncio.Future | None = None,
                      channel: str = "experience") -> tuple[list[PromptGroup], float]:
        """The barrier trainer's input: chunks from `channel` ("scored" where the step has
        no inference stage) until all the step's groups are in (`num_groups`, or
        `final`'s once it is known); and when the first chunk came."""
        groups: list[PromptGroup] = []
        first = 0.0
        experience = self.host.ctl.channel("experience")  # (a literal: the static hypergraph reads it)
        if channel != "experience":
            experience = self.host.ctl.channel(channel)
        while len(groups) < num_groups:
            get = asyncio.ensure_future(experience.get())
            if final is not None and not final.done():
                await asyncio.wait([get, final], return_when=asyncio.FIRST_COMPLETED)
            if final is not None and final.done():
                num_groups = final.result()
                if not get.done() and len(groups) >= num_groups:
                    get.cancel()  # (a cancelled get takes nothing: transport/channel.py)
                    break
            groups += await get
            first = first or asyncio.get_running_loop().time()
        return groups, first


SAMPLES_FILE = "samples.jsonl"
"""run.save_samples: each step's trained samples."""


def trained_samples(step: int, ids: list[str], batch: TrainBatch) -> dict[str, Any]:
    """One samples.jsonl line: the step's samples as the trainer was given them."""
    masks = batch.response_mask or [None] * len(ids)
    rewards = batch.rewards or [None] * len(ids)
    return {"step": step, "samples": [
        {"id": i, "input_ids": list(x), "prompt_len": p,
         "mask": list(m) if m is not None else [1] * (len(x) - p), "reward": r}
        for i, x, p, m, r in zip(ids, batch.input_ids, batch.prompt_lens, masks, rewards, strict=True)]}
