"""Embodied RL, the macro flow (RLinf's embodied workload): PPO with a critic on a
simulator, env workers beside the policy.

    env workers   each steps its own chunk of envs (components/embodied/env_worker.py)
    rollout       the policy acts on a chunk's observations (PolicyWorker.act)
    trainer       GAE and PPO over the iteration's transitions (LearnerWorker.train)
    weight sync   trainer -> rollout (the actor), version step + 1

An iteration: every chunk runs `embodied.horizon` steps, each an act on the policy
and a step on its env worker; the chunks run at once, so the policy serves one
chunk while the others step (pipelining at the granularity of env chunks). Then the
trainer trains on all of them and the actor's weights go to the policy. One call
computes on a device at a time (`turns`): a policy rank acts for one chunk at a time,
and an env worker and a policy rank on one device take turns. `embodied.
pipeline_stages` cuts each env worker's envs into that many chunks, so the worker
steps one while the policy acts for another.

Placement (placement.mode): hybrid, RLinf's default for embodied runs: env workers
on devices of their own, rollout and trainer time-sharing the next one (device_lock);
spatial: rollout and trainer on one device each; colocated: everything on the
cluster's devices, time-shared. `dynarl sim` gives the workflow placements of many
policy and learner ranks (components/placement/embodied.py) and emulated workers
(embodied.backend emulated); the learner's ranks train on their part of the envs.
An env worker whose step passes
embodied.step_timeout_s is restarted on its device (counted); an env that crashes is
reset by its worker (counted). Metrics per iteration: the return and success rate
of the episodes that ended, env steps per second, the env workers' idle share, and
the seconds the env workers stepped and the policy acted.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.embodied.emulated import (EmulatedEnvWorker, EmulatedLearner, EmulatedPolicyWorker,
                                                  EmulatedTrainMetrics)
from dynarl.components.embodied.learn import PPOMetrics
from dynarl.components.embodied.env_worker import EnvStep, EnvWorker
from dynarl.components.embodied.spaces import EnvSpec, describe
from dynarl.components.embodied.workers import Action, LearnerWorker, PolicyWorker, Trajectory
from dynarl.components.placement.embodied import ChunkSpec, EmbodiedPlacement, place
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows import jsonl
from dynarl.components.workflows.embodied_barrier import EmbodiedBarrier
from dynarl.components.workflows.embodied_config import EmulatedEmbodiedConfig
from dynarl.components.workflows.span_log import SpanLog
from dynarl.components.workflows.stages import Span, StageClock, held
from dynarl.core.controller import Controller
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel


@dataclass(slots=True)
class Chunk:
    """One env worker's transitions of an iteration, [T][envs]."""
    obs: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    rewards: list = field(default_factory=list)
    terminated: list = field(default_factory=list)
    truncated: list = field(default_factory=list)
    final_obs: list = field(default_factory=list)
    last_obs: list = field(default_factory=list)
    episodes: list = field(default_factory=list)
    errors: int = 0
    restarts: int = 0
    busy_s: float = 0.0
    """The env worker's time stepping."""
    act_s: float = 0.0
    """The policy's time acting for this chunk."""


STEP_FIELDS = ("obs", "actions", "logprobs", "rewards", "terminated", "truncated", "final_obs")


def split_envs(tr: Trajectory, parts: int) -> list[Trajectory]:
    """Pure: the trajectory's envs in `parts` contiguous parts (the learner's data-parallel
    ranks'), as even as they divide; one part is the trajectory itself."""
    if parts == 1:
        return [tr]
    n = len(tr.last_obs)
    if n < parts:
        raise ValueError(f"{n} envs cannot be split over {parts} learner ranks")
    bounds = [n * k // parts for k in range(parts + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        out.append(Trajectory(**{name: [row[a:b] for row in getattr(tr, name)] for name in STEP_FIELDS},
                              last_obs=tr.last_obs[a:b]))
    return out


def trajectory(chunks: list[Chunk]) -> Trajectory:
    """The iteration's transitions: at each step, the chunks' envs side by side."""
    steps = len(chunks[0].obs)
    joined = {name: [sum((getattr(c, name)[t] for c in chunks), []) for t in range(steps)] for name in STEP_FIELDS}
    return Trajectory(**joined, last_obs=sum((c.last_obs for c in chunks), []))


class Embodied:
    def __init__(self, ctl: Controller, cfg: Any, source: Any, tokenizer: Any, run_dir: str | None,
                 progress: Any, *, placement: EmbodiedPlacement | None = None) -> None:
        """`placement` defaults to cfg's (place); `run_dir` None writes no files (a simulation)."""
        self.ctl, self.cfg, self.run_dir, self.progress = ctl, cfg, run_dir, progress
        e = cfg.embodied
        self.emulated = (e.emulated or EmulatedEmbodiedConfig()) if e.backend == "emulated" else None
        """backend emulated: the emulated workers' costs (components/embodied/emulated.py)."""
        self.spec: EnvSpec = describe(e.env_id) if self.emulated is None else self.emulated.spec
        self.placement = placement or place(cfg.placement.mode, e.env_workers, cfg.runtime.cluster.num_devices,
                                            e.pipeline_stages, e.learner_ranks)
        if len(self.placement.env) != e.env_workers:
            raise ValueError(f"the placement has {len(self.placement.env)} env workers, embodied.env_workers "
                             f"{e.env_workers}")
        if self.emulated is None and len(self.placement.rollout) != 1:
            raise ValueError("the gym backend's policy runs on one rank")
        self.barrier = self._barrier() if cfg.scheduler.policy == "dynarl" else None
        """scheduler.policy dynarl (emulated workers): the scheduler's barrier rule (embodied_barrier.py)."""
        self.turns: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        """Device -> its turn: one call computes on a device at a time (an env step, an act):
        an env worker and a policy rank on one device (colocated) take turns, and a policy
        rank acts for one chunk at a time."""
        self.clock = StageClock(on_stage=progress.stage)
        self.span_log = SpanLog(run_dir)
        """spans.jsonl: the clock's spans, a line per step (the dashboard reads them)."""
        self.envs: list[WorkerGroup] = []
        self.policy: WorkerGroup | None = None
        self.learner: WorkerGroup | None = None
        self.last_return: float | None = None
        self.restarts = 0
        """Env workers restarted in this run (hung)."""
        self.retired: list[WorkerGroup] = []
        """The env worker groups restarts replaced (stopped)."""

    # --- the run ---------------------------------------------------------------------
    async def run(self, resume: tuple[str, ckpt.CheckpointState] | None = None) -> None:
        await self.spawn()
        start = 0
        if resume is not None:
            start = await self.restore(*resume)
        else:
            await self.sync_weights(0, "start")
            await self.checkpoint(0)
        for step in range(start, self.cfg.run.steps):
            metrics = await self.step(step)
            if (step + 1) % self.cfg.run.checkpoint_every == 0 or step + 1 == self.cfg.run.steps:
                await self.checkpoint(step + 1)
            jsonl.append(os.path.join(self.run_dir, "metrics.jsonl"), metrics)
            self.span_log.write(step, self.clock.spans)
            self.progress.step(metrics)

    async def spawn(self) -> None:
        p, ctl = self.placement, self.ctl
        self.progress.stage("spawn")
        env_cls, policy_cls, learner_cls = ((EnvWorker, PolicyWorker, LearnerWorker) if self.emulated is None else
                                            (EmulatedEnvWorker, EmulatedPolicyWorker, EmulatedLearner))
        envs = [ctl.spawn(env_cls, name=f"env{i}", devices=[d], init=self.env_init(i)) for i, d in enumerate(p.env)]
        *self.envs, self.policy, self.learner = await gather_or_cancel([
            *envs, ctl.spawn(policy_cls, name="rollout", devices=list(p.rollout), init=self.policy_init()),
            ctl.spawn(learner_cls, name="trainer", devices=list(p.trainer), init=self.learner_init())])
        dp = "trainer_dp" if self.learner.world_size > 1 else None  # the learner's ranks' data-parallel group
        if dp is not None:
            await ctl.process_group(dp, [self.learner])
        await self.learner.call(LearnerWorker.start, dp)
        await ctl.process_group("weight_sync", [(self.learner, 0), self.policy])

    def worker_groups(self) -> list[WorkerGroup]:
        return [*self.envs, self.policy, self.learner]

    def policy_init(self) -> dict[str, Any]:
        init: dict[str, Any] = {"spec": self.spec, "hidden": self.cfg.embodied.hidden}
        if self.emulated is not None:
            init |= {"emulated": self.emulated, "shares_device": bool(set(self.placement.rollout)
                                                                      & set(self.placement.trainer))}
        return init

    def _barrier(self) -> EmbodiedBarrier:
        """The barrier rule's move costs are a P2P move's on emulated devices: the learner's
        state over one link and a role switch (engine_costs.move_costs)."""
        from dynarl.components import costmodel, engine_costs
        move_s = engine_costs.trainer_state_s(self.emulated.learner()) + costmodel.role_switch_time()
        return EmbodiedBarrier(self, move_s, self.cfg.scheduler.dynarl.policy_config())

    def learner_init(self) -> dict[str, Any]:
        cfg = self.cfg
        if self.emulated is None:
            return {"spec": self.spec, "config": cfg.embodied, "seed": cfg.run.seed}
        em = self.emulated
        return {"model": cfg.model, "engine": cfg.trainer.engine, "warmup_lr": cfg.trainer.warmup.lr,
                "bucket_bytes": cfg.trainer.sync_bucket_bytes, "backend": "emulated",
                "shares_device": bool(set(self.placement.rollout) & set(self.placement.trainer)),
                "backend_config": em.learner(),
                "emulated": em}

    async def step(self, step: int) -> dict[str, Any]:
        label = f"step {step}"
        now = asyncio.get_running_loop().time  # (virtual time in a simulation)
        begun = now()
        specs = self.placement.chunks(self.cfg.embodied.envs_per_worker)
        chunks = await held(self.ctl, self.policy, self.clock, label, "act", lambda: gather_or_cancel(
            [self.run_chunk(i, spec, step, label) for i, spec in enumerate(specs)]))
        rollout_s = now() - begun
        train_begun = now()
        learner, batch = self.learner, trajectory(chunks)
        lent = None if self.barrier is None else \
            await self.barrier.lend(len(batch.obs) * len(batch.last_obs), len(batch.last_obs))
        ranks = learner.world_size + (lent.world_size if lent is not None else 0)
        try:
            parts = split_envs(batch, ranks)
            trained = await held(self.ctl, learner, self.clock, label, "train", lambda: gather_or_cancel(
                [learner.scatter(LearnerWorker.train, [[part] for part in parts[:learner.world_size]])]
                + ([] if lent is None
                   else [lent.scatter(LearnerWorker.train, [[part] for part in parts[learner.world_size:]])])))
        finally:
            if lent is not None:
                await self.barrier.give_back(lent)
        train = trained[0][0]
        if self.emulated is None and learner.world_size > 1:  # replicas must not drift apart
            digests = await learner.call(LearnerWorker.weights_digest)
            if len(set(digests)) > 1:
                raise RuntimeError(f"step {step}: the learner's data-parallel replicas hold different weights")
        trainer_s = now() - train_begun
        sync_begun = now()
        await self.sync_weights(step + 1, label)
        return self.metrics(step, chunks, train, rollout_s, trainer_s, now() - sync_begun, now() - begun) \
            | {"learner_ranks": ranks, "barrier_moves": 0 if lent is None else 2}

    async def run_chunk(self, i: int, spec: ChunkSpec, step: int, label: str) -> Chunk:
        """Chunk i's envs through the horizon: act, step, repeat."""
        e, chunk, p = self.cfg.embodied, Chunk(), self.placement
        w, first, n = spec.worker, spec.first, spec.count
        env = self.envs[w]
        obs = (await env.call(EnvWorker.observations, first, n))[0]
        loop = asyncio.get_running_loop()
        begun = loop.time()
        for t in range(e.horizon):
            async with self.turns[p.rollout[spec.rank]]:
                asked = loop.time()
                act: Action = (await self.policy.on([spec.rank]).call(
                    PolicyWorker.act, obs, _seed(self.cfg.run.seed, step, i, t)))[0]
                chunk.act_s += loop.time() - asked
            async with self.turns[p.env[w]]:
                out: EnvStep | None = None
                if env is self.envs[w]:
                    try:
                        async with asyncio.timeout(e.step_timeout_s):
                            out = (await env.call(EnvWorker.step, act.env_actions, first))[0]
                    except TimeoutError:  # a hung simulator: a fresh worker on the device
                        await self.restart_env(w)
                        chunk.restarts += 1
                if out is None:  # restarted (here or by another of its chunks): the step ends its episodes
                    env = self.envs[w]
                    fresh = (await env.call(EnvWorker.observations, first, n))[0]
                    out = EnvStep(obs=fresh, rewards=[0.0] * n, terminated=[False] * n, truncated=[True] * n,
                                  final_obs=obs, episodes=[])
            chunk.obs.append(obs)
            chunk.actions.append(act.actions)
            chunk.logprobs.append(act.logprobs)
            for name in ("rewards", "terminated", "truncated", "final_obs"):
                getattr(chunk, name).append(getattr(out, name))
            chunk.episodes += out.episodes
            chunk.errors += out.errors
            chunk.busy_s += out.busy_s
            obs = out.obs
        chunk.last_obs = obs
        self.clock.spans.append(Span("env", [p.env[w]], begun, loop.time(), label))
        return chunk

    async def restart_env(self, i: int) -> WorkerGroup:
        """Env worker i, hung, stopped (its process reaped) and started again on its device
        with seeds of its own (the restart's number)."""
        e, old = self.cfg.embodied, self.envs[i]
        self.progress.note(f"env worker {i} hung past {e.step_timeout_s} s: restarted, its envs reset")
        self.restarts += 1
        self.retired.append(old)
        await self.ctl.stop_group(old)
        env_cls = EnvWorker if self.emulated is None else EmulatedEnvWorker
        self.envs[i] = await self.ctl.spawn(env_cls, name=f"env{i}~{self.restarts}", devices=[self.placement.env[i]],
                                            init=self.env_init(i, restart=self.restarts))
        return self.envs[i]

    def env_init(self, i: int, restart: int = 0) -> dict[str, Any]:
        e = self.cfg.embodied
        init = {"env_id": e.env_id, "num_envs": self.placement.envs[i] if self.placement.envs else e.envs_per_worker,
                "seed": self.cfg.run.seed + 7919 * i + 104_729 * restart}
        return init if self.emulated is None else init | {"spec": self.spec, "emulated": self.emulated}

    def metrics(self, step: int, chunks: list[Chunk], train: PPOMetrics | EmulatedTrainMetrics, rollout_s: float,
                trainer_s: float, sync_s: float, step_s: float) -> dict[str, Any]:
        episodes = [ep for c in chunks for ep in c.episodes]
        if episodes:
            self.last_return = sum(ep[0] for ep in episodes) / len(episodes)
        successes = [ep[2] for ep in episodes if ep[2] >= 0]
        env_steps = sum(len(c.rewards) * len(c.rewards[0]) for c in chunks if c.rewards)
        return {
            "step": step, "reward_mean": self.last_return,  # None until an episode has ended
            "episodes": len(episodes),
            "episode_len_mean": sum(ep[1] for ep in episodes) / len(episodes) if episodes else 0.0,
            **({"success_rate": sum(successes) / len(successes)} if successes else {}),
            "env_steps": env_steps, "env_steps_per_s": env_steps / rollout_s,
            "env_idle_frac": 1 - sum(c.busy_s for c in chunks) / (len(self.envs) * rollout_s),  # (per worker)
            "env_busy_s": sum(c.busy_s for c in chunks), "act_busy_s": sum(c.act_s for c in chunks),
            "env_errors": sum(c.errors for c in chunks), "env_restarts": sum(c.restarts for c in chunks),
            "rollout_s": rollout_s, "trainer_s": trainer_s, "sync_s": sync_s, "step_time_s": step_s,
            "time": time.time(), **train.row()}

    # --- weights and checkpoints ---------------------------------------------------------
    async def sync_weights(self, version: int, label: str) -> None:
        learner, policy = self.learner, self.policy
        await held(self.ctl, learner, self.clock, label, "sync", lambda: gather_or_cancel([
            learner.on([0]).call(LearnerWorker.send_weights, "weight_sync", version),  # (replicas: rank 0 sends)
            policy.call(PolicyWorker.receive_weights, "weight_sync", version)]), lock=False, component="sync")

    async def checkpoint(self, step: int) -> None:
        path = ckpt.checkpoint_dir(self.run_dir, step)
        ckpt.begin(path)
        steps = await self.learner.call(LearnerWorker.save_checkpoint, path)
        ckpt.write_state(path, ckpt.CheckpointState(step=step, trainer_step=steps[0], seed=self.cfg.run.seed,
                                                    prompts_per_step=self.cfg.run.prompts_per_step))
        ckpt.prune(self.run_dir, self.cfg.run.keep_checkpoints, verified=path)

    async def restore(self, path: str, state: ckpt.CheckpointState) -> int:
        """The learner's actor, critic and optimizer from a checkpoint; metrics of later
        steps roll back. The envs start new episodes (their simulator state is not kept)."""
        refused = ckpt.workflow_refused(path, "embodied")  # (dynarl train checks it before any worker starts)
        if refused is not None:
            raise ValueError(f"{path}: {refused}")
        await self.learner.call(LearnerWorker.load_checkpoint, path)
        jsonl.roll_back(os.path.join(self.run_dir, "metrics.jsonl"), state.step)
        await self.sync_weights(state.step, "restore")
        self.progress.note(f"resumed from {path}: step {state.step}")
        return state.step


def _seed(seed: int, step: int, chunk: int, t: int) -> int:
    """The action sampling seed of chunk `chunk`'s step t of iteration `step`."""
    return ((seed * 1_000_003 + step) * 10_007 + chunk) * 100_003 + t

