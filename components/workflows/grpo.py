"""GRPO, the macro flow. One step reads like the algorithm:

    put the step's prompt groups on "prompts"
    rollout    "prompts"  -> "rollouts"     n samples per prompt, chunks of finished groups
    reward     "rollouts" -> "scored"       verify every sample
               (judge.enabled: -> "rewarded", then the LLM judge -> "scored": judge_stage.py)
    inference  "scored"   -> "experience"   old (and reference) log-probs
    trainer    "experience"                 one GRPO step on the whole batch, exactly once per sample
    weight sync trainer -> rollout, inference   (version step + 1)

The same code runs in every placement mode: placement decides which devices the
groups hold, device_lock time-shares the shared ones, and the chunked channels
let a stage on its own devices start before its upstream has finished. With
`trainer.streaming` the trainer is a stage too. The step's modes are pipeline.py's;
the run around the steps (warm start, checkpoints, resume) is job.py's.

`dynarl train` and `dynarl sim` run this class: the simulator gives it emulated
engines on emulated devices, a workload's prompt groups (components/workloads/
prompts.py) and its policy's placement, and drives `spawn` and `step` itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from dynarl.components import experience
from dynarl.components.experience import END, PromptGroup
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.reward.judge_worker import JudgeWorker
from dynarl.components.reward.worker import RewardWorker
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.base import TrainBatch, data_parts
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native.packing import packing_budget
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows.job import Groups, Job
from dynarl.components.workflows.judge_stage import judge_metrics, judged, spawn_judge
from dynarl.components.workflows.joins import StepRanks
from dynarl.components.workflows.ledger import StepEntry, append_entry
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.overlap import MadeAhead
from dynarl.components.workflows.partial import Partial, take_back
from dynarl.components.workflows.pipeline import AHEAD, Fresh, StageStats, StepPipeline
from dynarl.components.workflows.refill import Refilled
from dynarl.components.workflows.stages import held, stage
__all__ = ["GRPO", "Groups"]  # (Groups: dynamic.py names it from here)


class GRPO(Job):
    rollout_worker: type = RolloutWorker
    """The rollout rank's class; the agentic workflow serves turns with a subclass."""
    reward_worker: type | None = RewardWorker
    """The group that scores rollouts; None: the workflow scores them itself."""
    inference_worker: type = InferenceWorker
    """The inference rank's class."""
    judge_worker: type = JudgeWorker
    """The LLM judge rank's class (judge.enabled: judge_stage.py)."""
    step_ranks: type = StepRanks
    """How ranks join and leave its running step (joins.py: what a move asks of it)."""
    trainer_passes = 1.0
    """Training steps' worth of work its train call does per token (workflows/rates.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Job's arguments; the step's batch source follows the config (pipeline.py):
        rollout.oversample > 1, partial rollout (partial.py); algorithm.dynamic_sampling,
        refilled (refill.py); algorithm.max_staleness k, made up to k steps ahead (overlap.py);
        else fresh."""
        super().__init__(*args, **kwargs)
        cfg, r = self.cfg, self.cfg.rollout
        if r.oversample > 1:
            self.batches: Any = Partial(self.ctl, self.prompts, self.start_rollout, self.close_rollout,
                                        prompts_per_step=cfg.run.prompts_per_step, oversample=r.oversample,
                                        max_staleness=cfg.algorithm.max_staleness)
        elif cfg.algorithm.dynamic_sampling:
            self.batches = Refilled(self.ctl, self.prompts, self.start_rollout, self.end_prompts,
                                    prompts_per_step=cfg.run.prompts_per_step, max_refills=cfg.algorithm.refills(cfg.run.prompts_per_step))
        elif cfg.algorithm.max_staleness > 0:
            self.batches = MadeAhead(self.ctl, self.prompts, self.start_rollout, cfg.run.steps,
                                     lambda: self.g.inference.world_size, depth=cfg.algorithm.max_staleness)
        else:
            self.batches = Fresh(self.prompts, self.start_rollout)
        self.pipeline = StepPipeline(self, self.batches)
        self.judged: dict[str, list[Any]] = {}
        """judge.enabled: each step label's judge results, until the step's metrics take them."""

    async def spawn(self) -> Groups:
        """Job's groups, and the LLM judge's where judge.enabled (judge_stage.py)."""
        groups = await super().spawn()
        groups.judge = await spawn_judge(self)
        return groups

    # --- the algorithm ---------------------------------------------------------------
    async def step(self, step: int) -> dict[str, Any]:
        """The batch source's groups through rollout, reward, inference and the trainer
        (pipeline.py), then the one ending: commit, the scheduler's end, the weight sync."""
        label = f"step {step}"
        started, begun = time.perf_counter(), asyncio.get_running_loop().time()
        live = await self.pipeline.begin(step)
        result = await self.batches.beside(step, self.pipeline.stages(step, label, live))
        metrics = await self.pipeline.end(step, label, result, started, begun)
        if self.g.judge is not None:
            metrics |= judge_metrics(self.judged.pop(label, []), self.clock.durations(label).get("judge", 0.0))
        return metrics

    async def start_rollout(self, groups: list[PromptGroup], step: int, label: str, live: LiveStep, *,
                            version: int | None = None, end: bool = True) -> tuple[asyncio.Future, asyncio.Future]:
        """The step's prompt groups go out; the rollout and reward stages start. The
        rollout samples with the weights of `version` (default: `step`'s). `end` False:
        more groups may follow; the caller ends the prompts (end_prompts)."""
        g = self.g
        for group in groups:
            await self.ctl.channel("prompts").put(group)
        if end:
            await self.end_prompts()
        rollout = live.joined("rollout", stage(
            self.ctl, g.rollout, RolloutWorker.generate, get="prompts", put="rollouts", clock=self.clock,
            label=label, version=step if version is None else version, chunk_size=self.rollout_chunk_size,
            sampling=self.sampling(), prefetch=-(-len(groups) // g.rollout.world_size) if end else 1,
            lock=live.rollout_lock, ranks_call=self.ranks_call("rollout", live.rollout_lock)))
        if g.judge is None:
            reward = live.done["reward"] = asyncio.ensure_future(stage(
                self.ctl, g.reward, RewardWorker.score, get="rollouts", put="scored", after=rollout, lock=False,
                clock=self.clock, label=label, ranks_call=self.ranks_call("reward", False)))
        else:  # the judge scores the reward stage's samples before inference reads them
            reward = live.done["reward"] = judged(self, asyncio.ensure_future(stage(
                self.ctl, g.reward, RewardWorker.score, get="rollouts", put="rewarded", after=rollout, lock=False,
                clock=self.clock, label=label, ranks_call=self.ranks_call("reward", False))), label)
        return rollout, reward

    async def end_prompts(self) -> None:
        """No more prompt groups this step: an END for each rollout rank."""
        for _ in range(self.g.rollout.world_size):
            await self.ctl.channel("prompts").put(END)

    async def close_rollout(self, step: int, carried: list[PromptGroup]) -> int:
        """Partial rollout: the step has its batch; every rollout rank (lent engines too)
        hands back its unfinished groups, no move meanwhile (onto `carried`, their tokens
        kept). Returns how many."""
        async with self.busy("rollout"):
            per_rank = await self.g.rollout.call(RolloutWorker.partial_close)
        return take_back(per_rank, step, carried)

    def ranks_call(self, component: str, locked: bool) -> Any:
        """How a stage calls the component's ranks: surviving a lost one (survival.py), or
        group.call (None)."""
        return None if self.survival is None else self.survival.stage_call(component, locked)

    def commit_step(self, step: int, ids: list[str], trained: experience.Trained) -> None:
        """The step's samples are trained: into the ledger, in memory and on disk."""
        digest, version = dict(zip(trained.ids, trained.digests)), dict(zip(trained.ids, trained.versions))
        entry = StepEntry(step, tuple(ids), tuple(digest[i] for i in ids), tuple(version[i] for i in ids))
        self.ledger.commit(entry)
        if self.run_dir is not None:
            append_entry(os.path.join(self.run_dir, ckpt.LEDGER_FILE), entry)

    async def train(self, batch: TrainBatch, label: str, method: Any = TrainerWorker.train) -> TrainMetrics:
        async with self.busy("trainer"):  # a train step is not interruptible
            trainer = self.g.trainer
            engine = self.cfg.trainer.engine  # a step that packs balances its ranks' parts by tokens
            by_tokens = (packing_budget([len(ids) for ids in batch.input_ids], engine.micro_batch_size,
                                        engine.max_tokens_per_micro_batch) > 0
                         if self.cfg.trainer.backend == "native" else (engine.max_tokens_per_micro_batch or 0) > 0)
            shards = [[batch.shard(*part, by_tokens=by_tokens).to_wire()]
                      for part in data_parts(trainer.world_size, self.tensor_parallel)]
            results = await held(self.ctl, trainer, self.clock, label, method.__name__,
                                 lambda: trainer.scatter(method, shards), component="trainer")
        return results[0]  # global metrics: the same on every rank

    def busy(self, name: str) -> Any:
        """No move interrupts `name` meanwhile (policy=dynarl)."""
        return contextlib.nullcontext() if self.scheduling is None else self.scheduling.busy(name)

    @property
    def live(self) -> LiveStep | None:
        """The step in progress (or the last one)."""
        return self.pipeline.live

    @property
    def stage_stats(self) -> StageStats | None:
        """The last step's per-rank stage results."""
        return self.pipeline.stats

    @property
    def behaviour(self) -> bool:
        """Batches carry the rollout's own log-probs (behav_logprobs): an older policy made
        them (the batch source's: overlapped or partial steps), or the loss corrects for the
        rollout engine's numerics (algorithm.rollout_correction)."""
        return self.batches.behaviour or self.cfg.trainer.engine.rollout_correction != "none"

    @property
    def partial(self) -> Partial | None:
        """rollout.oversample > 1: more groups generate than a step trains (partial.py)."""
        return self.batches if isinstance(self.batches, Partial) else None

    @property
    def rollout_chunk_size(self) -> int:
        """Groups per rollout chunk: rollout.chunk_size, or 1 where a closer decides each
        group as it finishes (partial rollout: its batch closes on the N-th group to finish;
        dynamic sampling: a dropped group's refill cannot wait on a chunk a rank still fills,
        which waits on the refill)."""
        return 1 if isinstance(self.batches, (Partial, Refilled)) else self.cfg.rollout.chunk_size

    def open_channels(self) -> None:
        """Each channel holds a whole step: on time-shared devices a stage reads only
        after the one before it has produced everything."""
        samples = self.cfg.run.prompts_per_step * self.cfg.rollout.samples_per_prompt
        capacity = max(1024, 2 * samples + 2 * self.placement.num_devices)
        for name in ("prompts", "rollouts", "scored", "experience", AHEAD):
            self.ctl.channel(name, capacity=capacity)
        if self.cfg.judge.enabled:
            self.ctl.channel("rewarded", capacity=capacity)
        if self.survival is not None:
            self.survival.open()

    # --- the data -----------------------------------------------------------------
    def train_batch(self, scored: list[PromptGroup], behaviour: bool = False) -> TrainBatch:
        """The trainer's batch from the step's scored groups (`behaviour`: with the
        rollout's own log-probs, experience.train_batch)."""
        return experience.train_batch(scored, self.cfg.with_ref, behaviour)

    def sampling(self) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                "max_new_tokens": r.max_new_tokens, "stop_token_ids": list(self.prompts.stop_token_ids)}
