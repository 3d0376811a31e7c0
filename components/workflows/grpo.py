"""GRPO, the macro flow. One step reads like the algorithm:

    put the step's prompt groups on "prompts"
    rollout    "prompts"  -> "rollouts"     n samples per prompt, chunks of finished groups
    reward     "rollouts" -> "scored"       verify every sample
    inference  "scored"   -> "experience"   old (and reference) log-probs
    trainer    "experience"                 one GRPO step on the whole batch, exactly once per sample
    weight sync trainer -> rollout, inference   (version step + 1)

The same code runs in every placement mode: placement decides which devices the
groups hold, device_lock time-shares the shared ones, and the chunked channels
let a stage on its own devices start before its upstream has finished.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

from dynarl.components import experience
from dynarl.components.experience import END, Group
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.reward.worker import RewardWorker
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.tasks.problem import stable_seed
from dynarl.components.tasks.source import ProblemSource
from dynarl.components.trainer.base import TrainBatch, data_parts
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows.config import TrainConfig
from dynarl.components.workflows.dynamic import DynamicScheduling, _plain
from dynarl.components.workflows.ledger import SampleLedger, StepEntry, append_entry
from dynarl.components.workflows.placement import shared_devices
from dynarl.components.workflows.stages import StageClock, held, stage
from dynarl.components.workflows.step_metrics import step_metrics
from dynarl.core.controller import Controller
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel


class Progress(Protocol):
    def stage(self, name: str) -> None: ...
    def warmup(self, done: int, total: int) -> None: ...
    def step(self, metrics: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...


@dataclass(slots=True)
class Groups:
    rollout: WorkerGroup
    reward: WorkerGroup | None
    """None where the workflow scores without one (agentic: the controller scores episodes)."""
    inference: WorkerGroup
    trainer: WorkerGroup


class GRPO(DynamicScheduling):
    rollout_worker: type = RolloutWorker
    """The rollout rank's class; the agentic workflow serves turns with a subclass."""
    reward_worker: type | None = RewardWorker
    """The group that scores rollouts; None: the workflow scores them itself."""

    def __init__(self, ctl: Controller, cfg: TrainConfig, source: ProblemSource, tokenizer: Any,
                 run_dir: str, progress: Progress) -> None:
        self.ctl, self.cfg, self.source, self.tokenizer = ctl, cfg, source, tokenizer
        self.run_dir = run_dir
        self.progress = progress
        self.clock = StageClock(on_stage=progress.stage)
        self.ledger = SampleLedger()
        self.g: Groups | None = None
        self.scheduler = None
        """policy=dynarl: moves devices inside a step; the workflow reads groups through it."""
        self.home: dict[str, list[int]] = {}
        """The configured placement, restored at the end of every step."""
        self.inits: dict[str, dict] = {}
        self._ticking = False

    # --- the algorithm ---------------------------------------------------------------
    def commit_step(self, step: int, ids: list[str], scored: list) -> None:
        """The step's samples are trained: into the ledger, in memory and on disk."""
        entry = StepEntry(step, tuple(ids), tuple(experience.token_digests(scored)))
        self.ledger.commit(entry)
        append_entry(os.path.join(self.run_dir, ckpt.LEDGER_FILE), entry)

    async def step(self, step: int) -> dict[str, Any]:
        g, label = self.g, f"step {step}"
        started, begun = time.perf_counter(), asyncio.get_running_loop().time()
        groups = self.prompt_groups(step)
        marks = None
        if self.scheduler is not None:
            marks = await self._begin_scheduling(sum(len(gr["samples"]) for gr in groups))
            ticker = self.ctl.spawn_task(self._tick_loop(), name=f"scheduler {label}")
        for group in groups:
            await self.ctl.channel("prompts").put(group)
        for _ in range(g.rollout.world_size):
            await self.ctl.channel("prompts").put(END)
        rollout = asyncio.ensure_future(stage(
            self.ctl, g.rollout, "generate", get="prompts", put="rollouts", clock=self.clock, label=label,
            version=step, chunk_size=self.cfg.rollout.chunk_size, sampling=self.sampling()))
        reward = asyncio.ensure_future(stage(
            self.ctl, g.reward, "score", get="rollouts", put="scored", after=rollout, lock=False,
            clock=self.clock, label=label))
        inference = asyncio.ensure_future(stage(
            self.ctl, g.inference, "compute_logprobs", get="scored", put="experience", after=reward,
            clock=self.clock, label=label, version=step))
        try:
            (scored, first_chunk), rollout_stats, reward_stats, _ = await gather_or_cancel(
                [self.collect(len(groups)), rollout, reward, inference])
        finally:
            if marks is not None:
                self._ticking = False
                await ticker  # a move in progress completes (or rolls back) first
        if marks is not None:
            # One more decision where generation has ended and the train step has not
            # begun: engines idle through the tail's end give their devices now.
            await self._tick_once()
        pipeline = {"first_chunk_s": first_chunk - begun, "rollout_end_s": self.clock.last_end("rollout") - begun}

        ids = experience.sample_ids(scored)
        self.ledger.check(step, ids)
        batch = experience.train_batch(scored, self.cfg.with_ref)
        if marks is not None:
            self.g.trainer = self.scheduler.group("trainer")
        train_devices = len(self.g.trainer.devices)
        train_begun = time.perf_counter()
        train = await self.train(batch, label)
        train_s = time.perf_counter() - train_begun
        train_end = asyncio.get_running_loop().time()
        self.commit_step(step, ids, scored)
        sched = {}
        if marks is not None:
            await self._restore(label)
            sched = self._scheduling_metrics(marks, train_end, self.clock.last_end("rollout"), label)
            self._profile(rollout_stats, self.clock.last_end("rollout") - begun, len(ids), train_s, train_devices)
        await self.sync_weights(step + 1, label)
        return step_metrics(step, scored, train, rollout_stats, reward_stats,
                            self.clock.durations(label), time.perf_counter() - started) | pipeline | sched

    async def collect(self, num_groups: int) -> tuple[list[Group], float]:
        """The trainer's input: chunks from "experience" until all the step's groups
        are in; and when the first chunk came (pipelining: before rollout ended?)."""
        groups: list[Group] = []
        first = 0.0
        while len(groups) < num_groups:
            groups += await self.ctl.channel("experience").get()
            first = first or asyncio.get_running_loop().time()
        return groups, first

    async def train(self, batch: TrainBatch, label: str, method: str = "train") -> dict[str, float]:
        async with self._busy("trainer"):  # a train step is not interruptible
            trainer = self.g.trainer
            shards = [[batch.shard(*part).to_wire()] for part in data_parts(trainer.world_size, self.tensor_parallel)]
            results = await held(self.ctl, trainer, self.clock, label, method,
                                 lambda: trainer.scatter(method, shards), component="trainer")
        return results[0]  # global metrics: the same on every rank

    async def sync_weights(self, version: int, label: str) -> None:
        g = self.g
        async with self._busy("trainer"), self._busy("rollout"):  # nor is a weight sync
            await held(self.ctl, g.trainer, self.clock, label, "sync", lambda: gather_or_cancel([
                g.trainer.call("send_weights", "weight_sync", version, ranks=self.export_ranks),
                g.rollout.call("receive_weights", "weight_sync", version),
                g.inference.call("receive_weights", "weight_sync", version)]), lock=False, component="sync")

    # --- the data -----------------------------------------------------------------
    def prompt_groups(self, step: int) -> list[Group]:
        n = self.cfg.run.prompts_per_step
        groups = []
        for index, problem in enumerate(self.source.problems(step * n, n)):
            samples = [{"id": f"{problem.id}/{k}", "seed": stable_seed(self.cfg.run.seed, "sample", problem.id, k)}
                       for k in range(self.cfg.rollout.samples_per_prompt)]
            groups.append({"index": index, "problem": problem.id, "answer": problem.answer,
                           "prompt_ids": self.tokenizer.encode(problem.prompt, add_bos=True), "samples": samples})
        return groups

    def sampling(self) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                "max_new_tokens": r.max_new_tokens, "stop_token_ids": [self.tokenizer.eos_id]}

    def warmup_batch(self, index: int) -> TrainBatch:
        """Supervised examples: prompt -> answer + EOS, advantage 1 on every answer token."""
        size = self.cfg.trainer.warmup.batch_size
        ids, plens = [], []
        for problem in self.source.warmup_problems(index * size, size):
            try:
                prompt = self.tokenizer.encode(problem.prompt, add_bos=True)
                answer = self.tokenizer.encode(problem.answer)
            except ValueError:  # an answer the tokenizer cannot spell cannot be imitated
                continue
            ids.append(prompt + answer + [self.tokenizer.eos_id])
            plens.append(len(prompt))
        return TrainBatch(input_ids=ids, prompt_lens=plens, advantages=[1.0] * len(ids))

    # --- the run ------------------------------------------------------------------
    async def run(self, resume: tuple[str, ckpt.CheckpointState] | None = None) -> None:
        self.g = await self.spawn()
        if resume is None:
            await self.warm_start()
            start = 0
        else:
            start = await self.restore(*resume)
        for step in range(start, self.cfg.run.steps):
            metrics = await self.step(step)
            if (step + 1) % self.cfg.run.checkpoint_every == 0 or step + 1 == self.cfg.run.steps:
                begun = time.perf_counter()
                await self.checkpoint(step + 1)
                metrics["checkpoint_s"] = time.perf_counter() - begun
            with open(os.path.join(self.run_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps(metrics) + "\n")
            self.progress.step(metrics)

    async def spawn(self) -> Groups:
        cfg, ctl = self.cfg, self.ctl
        devices = cfg.devices()
        shared = {c for users in shared_devices(devices).values() for c in users}
        model = _plain(cfg.model)
        bucket = cfg.trainer.sync_bucket_bytes
        self.progress.stage("spawn")
        reward_spawn = [ctl.spawn(self.reward_worker, name="reward", devices=[0], init={
            "model": model, "verifier": cfg.task.resolved_verifier})] if self.reward_worker else []
        rollout, inference, trainer, *reward = await gather_or_cancel([
            ctl.spawn(self.rollout_worker, name="rollout", devices=devices["rollout"], init={
                "model": model, "engine": _plain(cfg.rollout.engine), "bucket_bytes": bucket,
                "shares_device": "rollout" in shared,
                "backend": cfg.rollout.backend, "backend_config": _plain(cfg.rollout.sglang)}),  # engine_factory
            ctl.spawn(InferenceWorker, name="inference", devices=devices["inference"], init={
                "model": model, "micro_batch_size": cfg.inference.micro_batch_size, "with_ref": cfg.with_ref,
                "bucket_bytes": bucket, "shares_device": "inference" in shared}),
            ctl.spawn(TrainerWorker, name="trainer", devices=devices["trainer"], init={
                "model": model, "engine": cfg.trainer.engine.to_wire(), "warmup_lr": cfg.trainer.warmup.lr,
                "bucket_bytes": bucket, "shares_device": "trainer" in shared,
                "backend": cfg.trainer.backend, "backend_config": _plain(cfg.trainer.megatron)}),  # engine_factory
            *reward_spawn])
        if trainer.world_size > 1:
            await ctl.process_group("trainer_dp", [trainer])
        await trainer.call("start", "trainer_dp" if trainer.world_size > 1 else None)
        await self._check_data_parts(trainer)
        await ctl.process_group("weight_sync", [(trainer, 0), rollout, inference])
        if cfg.scheduler.policy == "dynarl":
            await self._make_scheduler(rollout, trainer, devices)
        return Groups(rollout, reward[0] if reward else None, inference, trainer)

    @property
    def tensor_parallel(self) -> int:
        megatron = self.cfg.trainer.megatron
        return megatron.tensor_parallel_size if self.cfg.trainer.backend == "megatron" and megatron else 1

    @property
    def export_ranks(self) -> list[int] | None:
        """Trainer ranks that take part in exporting the weights: rank 0 alone, or every
        rank when the export is a collective over tensor-parallel slices."""
        return [0] if self.tensor_parallel == 1 else None

    async def _check_data_parts(self, trainer: WorkerGroup) -> None:
        """The batch split assumes megatron's rank order; the ranks confirm it once."""
        expected = [list(p) for p in data_parts(trainer.world_size, self.tensor_parallel)]
        actual = await trainer.call("data_part")
        if actual != expected:
            raise RuntimeError(f"trainer ranks' data-parallel parts {actual} differ from the split {expected}")

    async def warm_start(self) -> None:
        total = self.cfg.trainer.warmup.steps
        for i in range(total):
            self.progress.warmup(i, total)
            batch = self.warmup_batch(i)
            await self.train(batch, "warmup", "warmup_step")
        self.progress.warmup(total, total)
        if self.cfg.with_ref:
            await self.g.trainer.call("save_model", os.path.join(self.run_dir, "reference"), ranks=self.export_ranks)
        await self.load_reference()
        await self.sync_weights(0, "warmup")
        await self.checkpoint(0)

    async def load_reference(self) -> None:
        if self.cfg.with_ref:
            await self.g.inference.call("load_reference", os.path.join(self.run_dir, "reference"))

    async def checkpoint(self, step: int) -> None:
        path = ckpt.checkpoint_dir(self.run_dir, step)
        trainer = self.g.trainer
        steps = await held(self.ctl, trainer, self.clock, f"checkpoint {step}", "save_checkpoint",
                           lambda: trainer.call("save_checkpoint", path), component="trainer")
        self.ledger.save(os.path.join(path, ckpt.LEDGER_FILE))
        ckpt.write_state(path, ckpt.CheckpointState(step=step, trainer_step=steps[0], seed=self.cfg.run.seed,
                                                    prompts_per_step=self.cfg.run.prompts_per_step))
        ckpt.prune(self.run_dir, self.cfg.run.keep_checkpoints)

    async def restore(self, path: str, state: ckpt.CheckpointState) -> int:
        """Trainer state, ledger and data cursor from a checkpoint; steps after it are rolled back."""
        mismatch = ckpt.resume_mismatch(state, self.cfg.run.seed, self.cfg.run.prompts_per_step)
        if mismatch is not None:  # (dynarl train checks this before any worker starts)
            raise ValueError(f"{path}: {mismatch}")
        trainer = self.g.trainer
        await held(self.ctl, trainer, self.clock, "restore", "load_checkpoint",
                   lambda: trainer.call("load_checkpoint", path))
        self.ledger = SampleLedger.load(os.path.join(path, ckpt.LEDGER_FILE))
        _roll_back(os.path.join(self.run_dir, ckpt.LEDGER_FILE), state.step)
        _roll_back(os.path.join(self.run_dir, "metrics.jsonl"), state.step)
        await self.load_reference()
        await self.sync_weights(state.step, "restore")
        self.progress.note(f"resumed from {path}: step {state.step}, {self.ledger.num_steps} steps in the ledger")
        return state.step


def _roll_back(path: str, step: int) -> None:
    """Keeps the JSON lines of steps before `step`; moves the rest to *.rolled_back.jsonl."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    keep = [line for line in lines if json.loads(line)["step"] < step]
    dropped = [line for line in lines if json.loads(line)["step"] >= step]
    if dropped:
        with open(path.removesuffix(".jsonl") + ".rolled_back.jsonl", "a") as f:
            f.writelines(dropped)
    with open(path + ".tmp", "w") as f:
        f.writelines(keep)
    os.replace(path + ".tmp", path)
