"""GRPO, the macro flow. One step reads like the algorithm:

    put the step's prompt groups on "prompts"
    rollout    "prompts"  -> "rollouts"     n samples per prompt, chunks of finished groups
    reward     "rollouts" -> "scored"       verify every sample
    inference  "scored"   -> "experience"   old (and reference) log-probs
    trainer    "experience"                 one GRPO step on the whole batch, exactly once per sample
    weight sync trainer -> rollout, inference   (version step + 1)

The same code runs in every placement mode: placement decides which devices the
groups hold, device_lock time-shares the shared ones, and the chunked channels
let a stage on its own devices start before its upstream has finished. With
`trainer.streaming` the trainer is a stage too: its ranks take scored samples from
"experience" as inference finishes them and step after the last.

`dynarl train` and `dynarl sim` run this class: the simulator gives it emulated
engines on emulated devices, a workload's prompt groups (components/workloads/
prompts.py) and its policy's placement, and drives `spawn` and `step` itself.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

from dynarl.components import experience
from dynarl.components.experience import END, PromptGroup
from dynarl.components.inference.worker import InferenceWorker
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.reward.worker import RewardWorker
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.tasks.prompts import TaskPrompts
from dynarl.components.tasks.source import ProblemSource
from dynarl.components.trainer.base import TrainBatch, data_parts
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows.auto_placement import auto_placement
from dynarl.components.workflows.config import TrainConfig
from dynarl.components.workflows.dynamic import DynamicScheduling
from dynarl.components.workflows import jsonl, nonfinite
from dynarl.components.workflows.ledger import SampleLedger, StepEntry, append_entry
from dynarl.components.workflows.joins import StepRanks
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.stages import StageClock, held, stage
from dynarl.components.workflows.overlap import AHEAD, OverlappedSteps
from dynarl.components.workflows.partial import PARTIAL_FILE, PartialSteps, resume_refused, stop_generation
from dynarl.components.workflows.step_metrics import fixed_devices, step_metrics
from dynarl.components.workflows import survival
from dynarl.core.files import atomic_open
from dynarl.core.controller import Controller
from dynarl.core.health import STATES
from dynarl.core.hypergraph import GRAPH_FILE
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel


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


@dataclass(slots=True)
class Groups:
    rollout: WorkerGroup
    reward: WorkerGroup | None
    """None where the workflow scores without one (agentic: the controller scores episodes)."""
    inference: WorkerGroup
    trainer: WorkerGroup


class GRPO:
    rollout_worker: type = RolloutWorker
    """The rollout rank's class; the agentic workflow serves turns with a subclass."""
    reward_worker: type | None = RewardWorker
    """The group that scores rollouts; None: the workflow scores them itself."""
    inference_worker: type = InferenceWorker
    """The inference rank's class."""
    multi_turn = False
    """A finished request is a sample (not a turn of an episode)."""
    step_ranks: type = StepRanks
    """How ranks join and leave its running step (joins.py: what a move asks of it)."""
    trainer_passes = 1.0
    """Training steps' worth of work its train call does per token (workflows/rates.py)."""

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
        self.live: LiveStep | None = None
        """The step in progress (or the last one)."""
        self.stage_results: dict[str, list[dict]] = {}
        """The last step's per-rank results of each stage (busy intervals, counters)."""
        self.clock = StageClock(on_stage=progress.stage)
        self.ledger = SampleLedger()
        self.g: Groups | None = None
        self.scheduling: DynamicScheduling | None = None
        """policy=dynarl: moves devices inside every step (dynamic.py)."""
        self.partial = PartialSteps(self) if cfg.rollout.oversample > 1 else None
        """rollout.oversample > 1: more groups generate than a step trains; the unfinished
        ones continue in the next steps (partial.py)."""
        self.overlap = OverlappedSteps(self) if cfg.algorithm.max_staleness > 0 and self.partial is None else None
        """algorithm.max_staleness 1: the next step's rollout runs while a step trains (overlap.py)."""
        self.survival = survival.Survival(self) if survival.applies(cfg) and not self.multi_turn else None
        """run.survive: a lost rollout, reward or inference rank is replaced within the step (survival.py)."""
        self.sync_bytes = 0
        """Bytes the last weight sync sent (the trainer's rank 0: one copy of the model in model.dtype)."""

    # --- the algorithm ---------------------------------------------------------------
    def commit_step(self, step: int, ids: list[str], trained: experience.Trained) -> None:
        """The step's samples are trained: into the ledger, in memory and on disk."""
        digest = dict(zip(trained.ids, trained.digests))
        version = dict(zip(trained.ids, trained.versions))
        entry = StepEntry(step, tuple(ids), tuple(digest[i] for i in ids), tuple(version[i] for i in ids))
        self.ledger.commit(entry)
        if self.run_dir is not None:
            append_entry(os.path.join(self.run_dir, ckpt.LEDGER_FILE), entry)

    def check_trained(self, step: int, ids: list[str], trained: experience.Trained) -> None:
        """Every sample of the step's batch was trained exactly once, and none before."""
        if len(trained.ids) != len(ids) or set(trained.ids) != set(ids):
            raise RuntimeError(f"step {step}: the trainer took {len(trained.ids)} samples "
                               f"({len(set(trained.ids))} distinct), the batch has {len(ids)}")
        self.ledger.check(step, ids)

    async def step(self, step: int) -> dict[str, Any]:
        if self.overlap is not None:
            return await self.overlap.step(step)
        if self.partial is not None:
            return await self.partial.step(step)
        if self.cfg.trainer.streaming:
            return await self.streaming_step(step)
        label = f"step {step}"
        started, begun = time.perf_counter(), asyncio.get_running_loop().time()
        groups = self.prompts.groups(step)
        sched = self.scheduling
        if self.survival is not None:
            await self.survival.replace_lost(step)
        live = self.live = LiveStep(step, later={"trainer"})
        if sched is not None:
            await sched.begin(live, groups)
        rollout, reward = await self.start_rollout(groups, step, label, live)
        inference = live.joined("inference", stage(
            self.ctl, self.g.inference, "compute_logprobs", get="scored", put="experience", after=reward,
            gate=live.gates.get("inference"), clock=self.clock, label=label, version=step,
            ranks_call=self.ranks_call("inference", True)))
        (scored, first_chunk), rollout_stats, reward_stats, inference_stats = await self._run_stages(
            live, label, [self.collect(len(groups)), rollout, reward, inference])
        live.later.clear()
        rollout_end = self.clock.last_end("rollout")
        pipeline = {"first_chunk_s": first_chunk - begun, "rollout_end_s": rollout_end - begun}

        ids = experience.sample_ids(scored)
        trained = experience.Trained()
        trained.add(sorted(scored, key=lambda gr: gr.index))
        self.check_trained(step, ids, trained)
        batch = self.train_batch(scored)
        train_devices = len(self.g.trainer.devices)
        train_begun = time.perf_counter()
        train = await self.train(batch, label)
        train_s = time.perf_counter() - train_begun
        self.commit_step(step, ids, trained)
        self.stage_results = {"rollout": rollout_stats, "reward": reward_stats, "inference": inference_stats}
        tokens = sum(len(x) for x in batch.input_ids)
        sched_metrics = fixed_devices(self.g) if sched is None else await sched.end(
            label, rollout_end=rollout_end, train_end=asyncio.get_running_loop().time(),
            measured={"rollout": rollout_stats, "inference": inference_stats,
                      "trainer": (train_devices, tokens * self.trainer_passes / train_s) if train_s > 0 else None},
            last=step + 1 == self.cfg.run.steps)
        await self.sync_weights(step + 1, label)
        return step_metrics(step, trained, train, rollout_stats, reward_stats,
                            self.clock.durations(label), time.perf_counter() - started) | pipeline | sched_metrics \
            | self.fleet_metrics(step + 1)

    async def start_rollout(self, groups: list[PromptGroup], step: int, label: str, live: LiveStep, *,
                            version: int | None = None) -> tuple[asyncio.Future, asyncio.Future]:
        """The step's prompt groups go out; the rollout and reward stages start. The
        rollout samples with the weights of `version` (default: `step`'s)."""
        g = self.g
        for group in groups:
            await self.ctl.channel("prompts").put(group)
        for _ in range(g.rollout.world_size):
            await self.ctl.channel("prompts").put(END)
        rollout = live.joined("rollout", stage(
            self.ctl, g.rollout, "generate", get="prompts", put="rollouts", clock=self.clock, label=label,
            version=step if version is None else version, chunk_size=self.rollout_chunk_size,
            sampling=self.sampling(), lock=live.rollout_lock, ranks_call=self.ranks_call("rollout", live.rollout_lock)))
        reward = live.done["reward"] = asyncio.ensure_future(stage(
            self.ctl, g.reward, "score", get="rollouts", put="scored", after=rollout, lock=False,
            clock=self.clock, label=label, ranks_call=self.ranks_call("reward", False)))
        return rollout, reward

    async def close_rollout(self, step: int, carried: list[PromptGroup]) -> int:
        """Partial rollout: the step has its batch; the rollout hands back its unfinished
        groups (onto `carried`, their tokens kept). Returns how many."""
        return await stop_generation(self, step, carried)

    def ranks_call(self, component: str, locked: bool) -> Any:
        """How a stage calls the component's ranks: surviving a lost one (survival.py), or
        group.call (None)."""
        return None if self.survival is None else self.survival.stage_call(component, locked)

    async def streaming_step(self, step: int) -> dict[str, Any]:
        """trainer.streaming: the trainer is a stage, its ranks accumulating the scored
        samples inference sends one by one (each carries its group's advantage), and
        stepping after END."""
        label = f"step {step}"
        started, begun = time.perf_counter(), asyncio.get_running_loop().time()
        groups = self.prompts.groups(step)
        sched = self.scheduling
        if self.survival is not None:
            await self.survival.replace_lost(step)
        live = self.live = LiveStep(step)
        if sched is not None:
            await sched.begin(live, groups)
        g = self.g
        rollout, reward = await self.start_rollout(groups, step, label, live)
        inference = live.joined("inference", stage(
            self.ctl, g.inference, "compute_logprobs", get="scored", put="experience", after=reward,
            gate=live.gates.get("inference"), clock=self.clock, label=label, version=step, split=True,
            ranks_call=self.ranks_call("inference", True)))
        trainer = live.joined("trainer", stage(
            self.ctl, g.trainer, "train_stream", get="experience", after=inference, gate=live.gates.get("trainer"),
            clock=self.clock, label=label, with_ref=self.cfg.with_ref))
        rollout_stats, reward_stats, inference_stats, trainer_stats = await self._run_stages(
            live, label, [rollout, reward, inference, trainer])
        ids = [s.id for group in groups for s in group.samples]
        trained = experience.Trained.merge(trainer_stats)
        self.check_trained(step, ids, trained)
        self.commit_step(step, ids, trained)
        self.stage_results = {"rollout": rollout_stats, "reward": reward_stats, "inference": inference_stats,
                              "trainer": trainer_stats}
        rollout_end = self.clock.last_end("rollout")
        starts = [b[0][0] for b in (r["busy"] for r in trainer_stats) if b]
        pipeline = {"first_chunk_s": (min(starts) if starts else begun) - begun, "rollout_end_s": rollout_end - begun}
        sched_metrics = fixed_devices(self.g) if sched is None else await sched.end(
            label, rollout_end=rollout_end, train_end=self.clock.last_end("trainer"),
            measured={"rollout": rollout_stats, "inference": inference_stats}, last=step + 1 == self.cfg.run.steps)
        await self.sync_weights(step + 1, label)
        return step_metrics(step, trained, trainer_stats[0]["metrics"], rollout_stats, reward_stats,
                            self.clock.durations(label), time.perf_counter() - started) | pipeline | sched_metrics \
            | self.fleet_metrics(step + 1)

    async def _run_stages(self, live: LiveStep, label: str, stages: list[Any]) -> list[Any]:
        """The step's stages to their end, the scheduler ticking beside them (policy
        dynarl; before a barrier trainer's turn it decides once more); a failure stops
        the scheduler and is raised."""
        sched = self.scheduling
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

    def open_channels(self) -> None:
        """Each channel holds a whole step: on time-shared devices a stage reads only
        after the one before it has produced everything."""
        samples = self.cfg.run.prompts_per_step * self.cfg.rollout.samples_per_prompt
        capacity = max(1024, 2 * samples + 2 * self.placement.num_devices)
        for name in ("prompts", "rollouts", "scored", "experience", AHEAD):
            self.ctl.channel(name, capacity=capacity)
        if self.survival is not None:
            self.survival.open()

    async def collect(self, num_groups: int) -> tuple[list[PromptGroup], float]:
        """The trainer's input: chunks from "experience" until all the step's groups
        are in; and when the first chunk came (pipelining: before rollout ended?)."""
        groups: list[PromptGroup] = []
        first = 0.0
        while len(groups) < num_groups:
            groups += await self.ctl.channel("experience").get()
            first = first or asyncio.get_running_loop().time()
        return groups, first

    async def train(self, batch: TrainBatch, label: str, method: str = "train") -> TrainMetrics:
        async with self._busy("trainer"):  # a train step is not interruptible
            trainer = self.g.trainer
            shards = [[batch.shard(*part).to_wire()] for part in data_parts(trainer.world_size, self.tensor_parallel)]
            results = await held(self.ctl, trainer, self.clock, label, method,
                                 lambda: trainer.scatter(method, shards), component="trainer")
        return results[0]  # global metrics: the same on every rank

    def _busy(self, name: str) -> Any:
        """No move interrupts `name` meanwhile (policy=dynarl)."""
        return contextlib.nullcontext() if self.scheduling is None else self.scheduling.busy(name)

    async def sync_weights(self, version: int, label: str) -> None:
        g = self.g
        if self.survival is not None:  # (a replacement gets its weights from this sync)
            await self.survival.replace_lost(None)
        await self.weight_sync_group()
        async with self._busy("trainer"), self._busy("rollout"):  # nor is a weight sync
            try:
                sent, _, _ = await held(self.ctl, g.trainer, self.clock, label, "sync", lambda: gather_or_cancel([
                    g.trainer.call("send_weights", "weight_sync", version, ranks=self.export_ranks),
                    g.rollout.call("receive_weights", "weight_sync", version),
                    g.inference.call("receive_weights", "weight_sync", version)]), lock=False, component="sync")
            except Exception:
                # a receiver lost during the broadcast: replaced, and every rank still short
                # of `version` gets it over a group of its own (survival.py)
                if self.survival is None or not await self.survival.lost_receiver():
                    raise
                await held(self.ctl, g.trainer, self.clock, label, "sync",
                           lambda: self.survival.refit(version), lock=False, component="sync")
                sent = [0]  # (the refit's bytes are not counted)
        for h in (*g.rollout.handles, *g.inference.handles):
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
        members = [g.trainer.handles[0], *g.rollout.handles, *g.inference.handles]
        current = self.ctl.process_groups.active.get("weight_sync")
        if current is None or [id(h) for h in current.members] != [id(h) for h in members]:
            await self.ctl.process_group("weight_sync", [(g.trainer, 0), g.rollout, g.inference])

    # --- the data -----------------------------------------------------------------
    def train_batch(self, scored: list[PromptGroup], behaviour: bool = False) -> TrainBatch:
        """The trainer's batch from the step's scored groups (`behaviour`: with the
        rollout's own log-probs, experience.train_batch)."""
        return experience.train_batch(scored, self.cfg.with_ref, behaviour)

    def sampling(self) -> dict[str, Any]:
        r = self.cfg.rollout
        return {"temperature": r.temperature, "top_p": r.top_p, "top_k": r.top_k,
                "max_new_tokens": r.max_new_tokens, "stop_token_ids": list(self.prompts.stop_token_ids)}

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
            "reward": {"model": model, "verifier": cfg.task.resolved_verifier, "adv_eps": cfg.trainer.engine.adv_eps},
            "rollout": {"model": model, "engine": cfg.rollout.engine, "bucket_bytes": bucket,
                        "shares_device": "rollout" in shared, "move_kv": cfg.rollout.move_kv,
                        "kv_choice": cfg.rollout.kv_choice,
                        "backend": cfg.rollout.backend, "backend_config": rollout_backend, **self.rollout_init()},
            "inference": {"model": model, "micro_batch_size": cfg.inference.micro_batch_size, "with_ref": cfg.with_ref,
                          "bucket_bytes": bucket, "shares_device": "inference" in shared,
                          "backend": cfg.inference.backend, "backend_config": cfg.inference.emulated},
            "trainer": {"model": model, "engine": cfg.trainer.engine, "warmup_lr": cfg.trainer.warmup.lr,
                        "bucket_bytes": bucket, "shares_device": "trainer" in shared,
                        "backend": cfg.trainer.backend, "backend_config": trainer_backend}}

    async def spawn(self) -> Groups:
        cfg, ctl = self.cfg, self.ctl
        devices = {c: self.placement.rank_devices(c) for c in COMPONENTS}
        inits = self.worker_inits({c for c in COMPONENTS if self.placement.shares_devices(c)})
        self.progress.stage("spawn")
        reward_spawn = [ctl.spawn(self.reward_worker, name="reward", devices=[0], init=inits["reward"])
                        ] if self.reward_worker else []
        rollout, inference, trainer, *reward = await gather_or_cancel([
            ctl.spawn(self.rollout_worker, name="rollout", devices=devices["rollout"], init=inits["rollout"]),
            ctl.spawn(self.inference_worker, name="inference", devices=devices["inference"], init=inits["inference"]),
            ctl.spawn(TrainerWorker, name="trainer", devices=devices["trainer"], init=inits["trainer"]),
            *reward_spawn])
        if trainer.world_size > 1:
            await ctl.process_group("trainer_dp", [trainer])
        await trainer.call("start", "trainer_dp" if trainer.world_size > 1 else None)
        await self._check_data_parts(trainer)
        groups = Groups(rollout, reward[0] if reward else None, inference, trainer)
        if cfg.scheduler.policy == "dynarl":
            self.scheduling = await DynamicScheduling.create(self, groups)
        return groups

    def worker_groups(self) -> list[WorkerGroup]:
        """Every worker group the workflow spawned."""
        g = self.g
        return [x for x in (g.rollout, g.reward, g.inference, g.trainer) if x is not None]

    @property
    def rollout_chunk_size(self) -> int:
        """Groups per rollout chunk: rollout.chunk_size, or 1 with partial rollout (its
        batch closes on the N-th group to finish, not on a chunk a rank still fills)."""
        return 1 if self.partial is not None else self.cfg.rollout.chunk_size

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
        await self.warm_started()
        if self.cfg.with_ref:
            await self.g.trainer.call("save_model", os.path.join(self.run_dir, "reference"), ranks=self.export_ranks)
        await self.load_reference()
        await self.sync_weights(0, "warmup")
        await self.checkpoint(0)

    async def warm_started(self) -> None:
        """After the warm start, before the reference is saved and step 0's checkpoint:
        what else the workflow starts from the warm-started policy (ppo: its critic)."""

    async def save_components(self, path: str) -> None:
        """Into checkpoint `path`, before it is marked complete: the state of components
        beyond the trainer (ppo: its critic)."""

    async def load_reference(self) -> None:
        if self.cfg.with_ref:
            await self.g.inference.call("load_reference", os.path.join(self.run_dir, "reference"))

    async def checkpoint(self, step: int) -> None:
        path = ckpt.checkpoint_dir(self.run_dir, step)
        ckpt.begin(path)
        trainer = self.g.trainer
        steps = await held(self.ctl, trainer, self.clock, f"checkpoint {step}", "save_checkpoint",
                           lambda: trainer.call("save_checkpoint", path), component="trainer")
        self.ledger.save(os.path.join(path, ckpt.LEDGER_FILE))
        if self.overlap is not None:
            self.overlap.save(path)
        if self.partial is not None:
            self.partial.save(path)
        elif os.path.exists(os.path.join(path, PARTIAL_FILE)):  # from an earlier history of this directory
            os.remove(os.path.join(path, PARTIAL_FILE))
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
                   lambda: trainer.call("load_checkpoint", path))
        self.ledger = SampleLedger.load(os.path.join(path, ckpt.LEDGER_FILE))
        if self.overlap is not None:
            self.overlap.load(path, state.step)
        refused = resume_refused(path, self.cfg.rollout.oversample)  # (dynarl train checks it before any worker starts)
        if refused is not None:
            raise ValueError(f"{path}: {refused}")
        if self.partial is not None:
            self.partial.load(path, state.step)
        jsonl.roll_back(os.path.join(self.run_dir, ckpt.LEDGER_FILE), state.step)
        jsonl.roll_back(os.path.join(self.run_dir, "metrics.jsonl"), state.step)
        await self.load_reference()
        await self.sync_weights(state.step, "restore")
        self.progress.note(f"resumed from {path}: step {state.step}, {self.ledger.num_steps} steps in the ledger")
        return state.step
