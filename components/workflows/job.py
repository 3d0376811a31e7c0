"""The run around a workflow's steps: its state (controller, config, placement,
groups, ledger, clock), the warm start, checkpoints and resume, and the loop that
steps, checks, checkpoints and logs. The step itself is the workflow's (grpo.py)."""
from __future__ import annotations

import collections
import json
import os
from dataclasses import dataclass
import time
from typing import Any, Protocol

from dynarl.components.experience import PromptGroup
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.placement.threads import rank_threads
from dynarl.components.reward.config import reward_ranks
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.tasks.prompts import TaskPrompts
from dynarl.components.tasks.source import ProblemSource
from dynarl.components.trainer.base import TrainBatch, data_parts
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows import jsonl, nonfinite, survival
from dynarl.components.workflows.auto_placement import auto_placement
from dynarl.components.workflows.config import TrainConfig
from dynarl.components.workflows.dynamic import DynamicScheduling
from dynarl.components.workflows.ledger import SampleLedger
from dynarl.components.workflows.old_logprobs import needs_inference
from dynarl.components.workflows.partial import PARTIAL_FILE, resume_refused, stream_source
from dynarl.components.workflows.sample_text import TEXT_FILE
from dynarl.components.workflows.span_log import SPANS_FILE, SpanLog
from dynarl.components.workflows.stages import StageClock, held
from dynarl.core.config_tree import to_dict
from dynarl.core.controller import Controller
from dynarl.core.files import atomic_open
from dynarl.core.hypergraph import GRAPH_FILE
from dynarl.core.health import STATES
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel

LORA_BASE = "lora_base"
"""A LoRA run's warm-started policy (an HF folder in the run directory): the base its adapters train on."""


@dataclass(slots=True)
class Groups:
    rollout: WorkerGroup
    reward: WorkerGroup | None
    """None where the workflow scores without one (agentic: the controller scores episodes)."""
    inference: WorkerGroup | None
    """None where no step runs the inference stage (inference.old_logprobs auto: old_logprobs.py)."""
    trainer: WorkerGroup
    judge: WorkerGroup | None = None
    """The LLM judge's group, where judge.enabled (judge_stage.py)."""


class Progress(Protocol):
    def stage(self, name: str) -> None: ...
    def warmup(self, done: int, total: int) -> None: ...
    def step(self, metrics: dict[str, Any]) -> None: ...
    def note(self, text: str) -> None: ...


class Prompts(Protocol):
    """Where a step's prompt groups come from: a task (tasks/prompts.py) or a
    simulated workload (workloads/prompts.py)."""
    stop_token_ids: tuple[int, ...]

    def groups(self, step: int) -> list[PromptGroup]: ...


class Job:
    """A workflow's run. Its subclass (GRPO) gives the step, its worker classes,
    open_channels, train, busy and its batch source (`batches`: a checkpoint keeps its state)."""
    multi_turn = False
    """A finished request is a sample (not a turn of an episode)."""

    def __init__(self, ctl: Controller, cfg: TrainConfig, source: ProblemSource | None, tokenizer: Any,
                 run_dir: str | None, progress: Progress, *, prompts: Prompts | None = None,
                 placement: Placement | None = None) -> None:
        """`run_dir` None writes no files (a simulation); `prompts` defaults to the
        task's (source and tokenizer), `placement` to cfg's."""
        self.ctl, self.cfg, self.source, self.tokenizer = ctl, cfg, source, tokenizer
        self.run_dir = run_dir
        self.progress = progress
        self.prompts = prompts or TaskPrompts(source, tokenizer, prompts_per_step=cfg.run.prompts_per_step,
                                              samples_per_prompt=cfg.rollout.samples_per_prompt, seed=cfg.run.seed)
        self.placement: Placement | None = placement or (None if cfg.placement.mode == "auto"
                                                         else cfg.placement_plan())
        """None until placement.mode auto has profiled and planned (run)."""
        self.clock = StageClock(on_stage=progress.stage)
        self.ledger = SampleLedger()
        self.span_log = SpanLog(run_dir)
        """spans.jsonl: the clock's spans, a line per step (the dashboard reads them)."""
        self.g: Groups | None = None
        self.scheduling: DynamicScheduling | None = None
        """policy=dynarl: moves devices inside every step (dynamic.py)."""
        self.inference_pass = needs_inference(cfg)
        """Why the steps run the inference stage; None: the trainer's forward gives the old
        log-probs and there is none (inference.old_logprobs auto: old_logprobs.py)."""
        self.survival = survival.Survival(self) if survival.applies(cfg) and not self.multi_turn else None
        """run.survive: a lost rollout, reward or inference rank is replaced within the step (survival.py)."""
        self.sync_bytes = 0
        """Bytes the last weight sync sent (the trainer's rank 0: one copy of the model in model.dtype)."""

    # --- the run ------------------------------------------------------------------
    async def run(self, resume: tuple[str, ckpt.CheckpointState] | None = None) -> None:
        if self.placement is None:
            await self.plan_placement()
        self.open_channels()
        self.g = await self.spawn()
        if resume is None:
            await self.warm_start()
            start = 0
        else:
            start = await self.restore(*resume)
        for step in range(start, self.cfg.run.steps):
            metrics = await self.step(step)
            metrics["sync_bytes"] = self.sync_bytes  # the weight sync that ended the step
            stop = nonfinite.check(step, metrics, self.cfg.trainer.nonfinite, self.grad_norm_known)
            if stop is None and ((step + 1) % self.cfg.run.checkpoint_every == 0 or step + 1 == self.cfg.run.steps):
                begun = time.perf_counter()
                await self.checkpoint(step + 1)
                metrics["checkpoint_s"] = time.perf_counter() - begun
            jsonl.append(os.path.join(self.run_dir, "metrics.jsonl"), metrics)
            self.span_log.write(step, self.clock.spans)
            self.save_graph()
            self.progress.step(metrics)
            if stop is not None:
                raise stop

    async def plan_placement(self) -> None:
        """placement.mode auto: time the components, let rlinf-auto's planner place them
        (auto_placement.py); the profile and the plan go to placement.json."""
        self.progress.stage("profile")
        self.placement, report = await auto_placement(self)
        self.progress.note(f"placement auto: {report['placement']} (profiled: "
                           + ", ".join(f"{c} {p}" for c, p in report["profiles"].items()) + ")")
        if self.run_dir is not None:
            with open(os.path.join(self.run_dir, "placement.json"), "w") as f:
                json.dump(report, f, indent=1)

    def save_graph(self) -> None:
        """The runtime hypergraph as the scheduler last read it, channel traffic folded
        in: graph.json in the run directory (`dynarl graph RUN_DIR` prints it)."""
        path = os.path.join(self.run_dir, GRAPH_FILE)
        with atomic_open(path) as f:
            json.dump(self.ctl.refresh_graph().to_wire(), f)

    def worker_inits(self, shared: set[str] = frozenset()) -> dict[str, dict[str, Any]]:
        """Each component's worker constructor arguments (the components in `shared`
        time-share their devices): the job's groups, and the ranks a profile times."""
        cfg = self.cfg
        model, bucket = cfg.model, cfg.trainer.sync_bucket_bytes
        rollout_backend = {"sglang": cfg.rollout.sglang, "vllm": cfg.rollout.vllm}.get(cfg.rollout.backend,
                                                                                      cfg.rollout.emulated)
        trainer_backend = cfg.trainer.megatron if cfg.trainer.backend == "megatron" else cfg.trainer.emulated
        return {  # engines: engine_factory.py; the config sections cross as themselves (core/config_tree.wire_config)
            "reward": {"model": model, "verifier": cfg.task.resolved_verifier, "adv_eps": cfg.trainer.engine.adv_eps,
                       "engine": cfg.trainer.engine, "reward": to_dict(cfg.reward)},
            "rollout": {"model": model, "engine": cfg.rollout.engine, "bucket_bytes": bucket,
                        "shares_device": "rollout" in shared, "move_kv": cfg.rollout.move_kv,
                        "kv_choice": cfg.rollout.kv_choice,
                        "backend": cfg.rollout.backend, "backend_config": rollout_backend, **self.rollout_init()},
            "inference": {"model": model, "micro_batch_size": cfg.inference.micro_batch_size, "with_ref": cfg.with_ref,
                          "bucket_bytes": bucket, "shares_device": "inference" in shared,
                          "backend": cfg.inference.backend, "backend_config": cfg.inference.emulated,
                          "teacher": cfg.algorithm.teacher},
            "trainer": {"model": model, "engine": cfg.trainer.engine, "warmup_lr": cfg.trainer.warmup.lr,
                        "bucket_bytes": bucket, "shares_device": "trainer" in shared,
                        "backend": cfg.trainer.backend, "backend_config": trainer_backend}}

    async def spawn(self) -> Groups:
        cfg, ctl = self.cfg, self.ctl
        devices = {c: self.placement.rank_devices(c) for c in COMPONENTS}
        inits = self.worker_inits({c for c in COMPONENTS if self.placement.shares_devices(c)})
        num_reward = reward_ranks(cfg.reward.num_ranks, cfg.rollout.num_ranks, len(os.sched_getaffinity(0)))
        self.progress.stage("spawn")
        rollout, inference, trainer, reward = await gather_or_cancel([
            ctl.spawn(self.rollout_worker, name="rollout", devices=devices["rollout"], init=inits["rollout"],
                      threads=self.threads("rollout")),
            ctl.spawn(self.inference_worker, name="inference", devices=devices["inference"], init=inits["inference"],
                      threads=self.threads("inference")) if self.inference_pass is not None else _nothing(),
            ctl.spawn(TrainerWorker, name="trainer", devices=devices["trainer"], init=inits["trainer"],
                      threads=self.threads("trainer")),
            ctl.spawn(self.reward_worker, name="reward", devices=[0] * num_reward, init=inits["reward"])
            if self.reward_worker else _nothing()])
        if trainer.world_size > 1:
            await ctl.process_group("trainer_dp", [trainer])
        await trainer.call(TrainerWorker.start, "trainer_dp" if trainer.world_size > 1 else None)
        # the batch split assumes megatron's rank order; the ranks confirm it once
        expected = [list(p) for p in data_parts(trainer.world_size, self.tensor_parallel)]
        actual = await trainer.call(TrainerWorker.data_part)
        if actual != expected:
            raise RuntimeError(f"trainer ranks' data-parallel parts {actual} differ from the split {expected}")
        groups = Groups(rollout, reward, inference, trainer)
        if cfg.scheduler.policy == "dynarl":
            self.scheduling = await DynamicScheduling.create(self, groups)
        return groups

    def threads(self, component: str) -> int | None:
        """Torch threads of the component's ranks: runtime.worker_threads, or on a CPU
        cluster with it null, the cores the component has while it runs (rank_threads)."""
        cluster = self.cfg.runtime.cluster
        if self.cfg.runtime.worker_threads is not None or cluster.device_kind != "cpu":
            return self.cfg.runtime.worker_threads
        per_node = collections.Counter(d // cluster.devices_per_node for d in self.placement.rank_devices(component))
        return rank_threads(len(os.sched_getaffinity(0)), cluster.devices_per_node, max(per_node.values()),
                            self.placement.shares_devices(component))

    def worker_groups(self) -> list[WorkerGroup]:
        """Every worker group the workflow spawned."""
        g = self.g
        return [x for x in (g.rollout, g.reward, g.inference, g.trainer, g.judge) if x is not None]

    def rollout_init(self) -> dict[str, Any]:
        """Init arguments the workflow's rollout worker class adds (the agentic queue order)."""
        return {}

    @property
    def grad_norm_known(self) -> bool:
        """Whether a step's grad_norm is the engine's (megatron computes none without clipping)."""
        return self.cfg.trainer.backend != "megatron" or self.cfg.trainer.engine.grad_clip > 0

    @property
    def tensor_parallel(self) -> int:
        megatron = self.cfg.trainer.megatron
        return megatron.tensor_parallel_size if self.cfg.trainer.backend == "megatron" and megatron else 1

    @property
    def export_ranks(self) -> list[int] | None:
        """Trainer ranks that take part in exporting the weights: every rank when the
        export is a collective (the native trainer's FSDP2 shards, megatron's
        tensor-parallel slices), else rank 0 alone."""
        return None if self.cfg.trainer.backend == "native" or self.tensor_parallel > 1 else [0]

    async def sync_weights(self, version: int, label: str) -> None:
        g = self.g
        if self.survival is not None:  # (a replacement gets its weights from this sync)
            await self.survival.replace_lost(None)
        await self.weight_sync_group()
        async with self.busy("trainer"), self.busy("rollout"):  # nor is a weight sync
            try:
                sent, *_ = await held(self.ctl, g.trainer, self.clock, label, "sync", lambda: gather_or_cancel([
                    g.trainer.on(self.export_ranks).call(TrainerWorker.send_weights, "weight_sync", version),
                    g.rollout.call(RolloutWorker.receive_weights, "weight_sync", version),
                    *([g.inference.call(InferenceWorker.receive_weights, "weight_sync", version)]
                      if g.inference is not None else [])]),
                    lock=False, component="sync")
            except Exception:
                # a receiver lost during the broadcast: replaced, and every rank still short
                # of `version` gets it over a group of its own (survival.py)
                if self.survival is None or not await self.survival.lost_receiver():
                    raise
                await held(self.ctl, g.trainer, self.clock, label, "sync",
                           lambda: self.survival.refit(version), lock=False, component="sync")
                sent = [0]  # (the refit's bytes are not counted)
        for group in self.policy_groups():
            for h in group.handles:
                h.weight_version = version
        self.sync_bytes = sum(sent)

    def fleet_metrics(self, version: int) -> dict[str, Any]:
        """How many ranks are healthy, suspect, stale (weights older than `version`) or
        lost (core/health.py), and which are not healthy."""
        fleet = self.ctl.fleet(version)
        counts = {state: sum(1 for s in fleet.values() if s == state) for state in STATES}
        survived = self.survival.metrics() if self.survival is not None else {}
        return {"fleet": counts, "unhealthy": {name: s for name, s in fleet.items() if s != "healthy"}} | survived

    async def weight_sync_group(self) -> None:
        """The weight-sync group of the trainer's rank 0 and every rollout and inference
        rank: rebuilt only when its members changed (moves during a step; a standby pool
        usually hands the home devices back to the very processes that held them)."""
        g = self.g
        members = [g.trainer.handles[0], *(h for group in self.policy_groups() for h in group.handles)]
        current = self.ctl.process_groups.active.get("weight_sync")
        if current is None or [id(h) for h in current.members] != [id(h) for h in members]:
            await self.ctl.process_group("weight_sync", [(g.trainer, 0), *self.policy_groups()])

    def policy_groups(self) -> list[WorkerGroup]:
        """The groups that hold the policy's weights beside the trainer: the rollout's,
        and the inference stage's where the steps have one."""
        g = self.g
        return [g.rollout] if g.inference is None else [g.rollout, g.inference]

    async def warm_start(self) -> None:
        total = self.cfg.trainer.warmup.steps
        adapt = self.cfg.model.lora.enabled and total > 0
        if adapt:  # the warm start stands in for the pretrained base LoRA adapts: it trains the whole model
            await self.restart_trainer(adapters=False)
        for i in range(total):
            self.progress.warmup(i, total)
            batch = self.warmup_batch(i)
            await self.train(batch, "warmup", TrainerWorker.warmup_step)
        self.progress.warmup(total, total)
        if adapt:  # then the adapters go on the warm-started weights (frozen from here on)
            base = os.path.join(self.run_dir, LORA_BASE)
            await self.g.trainer.on(self.export_ranks).call(TrainerWorker.save_model, base)
            await self.restart_trainer(init_from=base)
        await self.warm_started()
        if self.cfg.with_ref:
            reference = os.path.join(self.run_dir, "reference")
            await self.g.trainer.on(self.export_ranks).call(TrainerWorker.save_model, reference)
        await self.load_reference()
        await self.sync_weights(0, "warmup")
        await self.checkpoint(0)

    async def restart_trainer(self, init_from: str | None = None, adapters: bool = True) -> None:
        trainer = self.g.trainer
        await trainer.call(TrainerWorker.start, "trainer_dp" if trainer.world_size > 1 else None, None, init_from,
                           adapters)

    async def warm_started(self) -> None:
        """After the warm start, before the reference is saved and step 0's checkpoint:
        what else the workflow starts from the warm-started policy (ppo: its critic)."""

    async def save_components(self, path: str) -> None:
        """Into checkpoint `path`, before it is marked complete: the state of components
        beyond the trainer (ppo: its critic)."""

    async def load_reference(self) -> None:
        if self.cfg.with_ref:
            await self.g.inference.call(InferenceWorker.load_reference, os.path.join(self.run_dir, "reference"))

    async def checkpoint(self, step: int) -> None:
        path = ckpt.checkpoint_dir(self.run_dir, step)
        ckpt.begin(path)
        trainer = self.g.trainer
        steps = await held(self.ctl, trainer, self.clock, f"checkpoint {step}", "save_checkpoint",
                           lambda: trainer.call(TrainerWorker.save_checkpoint, path), component="trainer")
        self.ledger.save(os.path.join(path, ckpt.LEDGER_FILE))
        if os.path.exists(os.path.join(path, PARTIAL_FILE)):  # from an earlier history of this directory
            os.remove(os.path.join(path, PARTIAL_FILE))
        self.batches.save(path)  # (what partial and overlapped steps carry into the next step)
        await self.save_components(path)
        ckpt.write_state(path, ckpt.CheckpointState(step=step, trainer_step=steps[0], seed=self.cfg.run.seed,
                                                    prompts_per_step=self.cfg.run.prompts_per_step))
        ckpt.prune(self.run_dir, self.cfg.run.keep_checkpoints, verified=path)

    async def restore(self, path: str, state: ckpt.CheckpointState) -> int:
        """Trainer state, ledger and data cursor from a checkpoint; steps after it are rolled back."""
        mismatch = ckpt.resume_mismatch(state, self.cfg.run.seed, self.cfg.run.prompts_per_step)
        if mismatch is not None:  # (dynarl train checks this before any worker starts)
            raise ValueError(f"{path}: {mismatch}")
        trainer = self.g.trainer
        await held(self.ctl, trainer, self.clock, "restore", "load_checkpoint",
                   lambda: trainer.call(TrainerWorker.load_checkpoint, path))
        self.ledger = SampleLedger.load(os.path.join(path, ckpt.LEDGER_FILE))
        refused = resume_refused(path, stream_source(self.cfg))  # (dynarl train checks it before any worker starts)
        if refused is not None:
            raise ValueError(f"{path}: {refused}")
        self.batches.load(path, state.step)
        jsonl.roll_back(os.path.join(self.run_dir, ckpt.LEDGER_FILE), state.step)
        jsonl.roll_back(os.path.join(self.run_dir, "metrics.jsonl"), state.step)
        jsonl.roll_back(os.path.join(self.run_dir, SPANS_FILE), state.step)
        jsonl.roll_back(os.path.join(self.run_dir, TEXT_FILE), state.step)
        await self.load_reference()
        await self.sync_weights(state.step, "restore")
        self.progress.note(f"resumed from {path}: step {state.step}, {self.ledger.num_steps} steps in the ledger")
        return state.step

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


async def _nothing() -> None:
    """A group not spawned (Job.spawn)."""
