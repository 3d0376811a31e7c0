"""Embodied RL, the macro flow (RLinf's embodied workload): PPO with a critic on a
simulator, env workers beside the policy.

    env workers   each steps its own chunk of envs (components/embodied/env_worker.py)
    rollout       the policy acts on a chunk's observations (PolicyWorker.act)
    trainer       GAE and PPO over the iteration's transitions (LearnerWorker.train)
    weight sync   trainer -> rollout (the actor), version step + 1

An iteration: every chunk runs `embodied.horizon` steps, each an act on the policy
and a step on its env worker; the chunks run at once, so the policy serves one
chunk while the others step (pipelining at the granularity of env chunks). Then the
trainer trains on all of them and the actor's weights go to the policy.

Placement (placement.mode): hybrid, RLinf's default for embodied runs: env workers
on devices of their own, rollout and trainer time-sharing the next one (device_lock);
spatial: rollout and trainer on one device each; temporal: everything on the
cluster's devices, time-shared. An env worker whose step passes
embodied.step_timeout_s is restarted on its device (counted); an env that crashes is
reset by its worker (counted). Metrics per iteration: the return and success rate
of the episodes that ended, env steps per second, the env workers' idle share.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.embodied.env_worker import EnvStep, EnvWorker
from dynarl.components.embodied.spaces import EnvSpec, describe
from dynarl.components.embodied.workers import Action, LearnerWorker, PolicyWorker, Trajectory
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows import jsonl
from dynarl.components.workflows.stages import Span, StageClock, held
from dynarl.core.controller import Controller
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel


@dataclass(frozen=True, slots=True)
class EmbodiedPlacement:
    mode: str
    env: tuple[int, ...]
    """Each env worker's device."""
    rollout: int
    trainer: int

    def describe(self) -> str:
        return f"env {list(self.env)} | rollout {self.rollout} | trainer {self.trainer}"


def place(mode: str, env_workers: int, num_devices: int) -> EmbodiedPlacement:
    """Pure: the devices of each component (see the module's docstring)."""
    if mode == "temporal":
        return EmbodiedPlacement(mode, tuple(i % num_devices for i in range(env_workers)), 0, 0)
    need = env_workers + (1 if mode == "hybrid" else 2)
    if mode not in ("hybrid", "spatial"):
        raise ValueError(f"the embodied workflow places envs temporal, hybrid or spatial, not {mode!r}")
    if num_devices < need:
        raise ValueError(f"{mode} placement of {env_workers} env workers needs {need} devices, the cluster has "
                         f"{num_devices}")
    return EmbodiedPlacement(mode, tuple(range(env_workers)), env_workers,
                             env_workers + (0 if mode == "hybrid" else 1))


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


STEP_FIELDS = ("obs", "actions", "logprobs", "rewards", "terminated", "truncated", "final_obs")


def trajectory(chunks: list[Chunk]) -> Trajectory:
    """The iteration's transitions: at each step, the chunks' envs side by side."""
    steps = len(chunks[0].obs)
    joined = {name: [sum((getattr(c, name)[t] for c in chunks), []) for t in range(steps)] for name in STEP_FIELDS}
    return Trajectory(**joined, last_obs=sum((c.last_obs for c in chunks), []))


class Embodied:
    def __init__(self, ctl: Controller, cfg: Any, source: Any, tokenizer: Any, run_dir: str | None,
                 progress: Any) -> None:
        self.ctl, self.cfg, self.run_dir, self.progress = ctl, cfg, run_dir, progress
        e = cfg.embodied
        self.spec: EnvSpec = describe(e.env_id)
        self.placement = place(cfg.placement.mode, e.env_workers, cfg.runtime.cluster.num_devices)
        self.clock = StageClock(on_stage=progress.stage)
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
            self.progress.step(metrics)

    async def spawn(self) -> None:
        cfg, e, p = self.cfg, self.cfg.embodied, self.placement
        self.progress.stage("spawn")
        envs = [self.ctl.spawn(EnvWorker, name=f"env{i}", devices=[d], init=self.env_init(i))
                for i, d in enumerate(p.env)]
        *self.envs, self.policy, self.learner = await gather_or_cancel([
            *envs, self.ctl.spawn(PolicyWorker, name="rollout", devices=[p.rollout],
                                  init={"spec": self.spec, "hidden": e.hidden}),
            self.ctl.spawn(LearnerWorker, name="trainer", devices=[p.trainer],
                           init={"spec": self.spec, "config": e, "seed": cfg.run.seed})])
        await self.ctl.process_group("weight_sync", [(self.learner, 0), self.policy])

    async def step(self, step: int) -> dict[str, Any]:
        label = f"step {step}"
        begun = time.perf_counter()
        chunks = await held(self.ctl, self.policy, self.clock, label, "act", lambda: gather_or_cancel(
            [self.run_chunk(i, step, label) for i in range(len(self.envs))]))
        rollout_s = time.perf_counter() - begun
        train_begun = time.perf_counter()
        learner = self.learner
        train = (await held(self.ctl, learner, self.clock, label, "train",
                            lambda: learner.call("train", trajectory(chunks))))[0]
        trainer_s = time.perf_counter() - train_begun
        sync_begun = time.perf_counter()
        await self.sync_weights(step + 1, label)
        return self.metrics(step, chunks, train, rollout_s, trainer_s, time.perf_counter() - sync_begun,
                            time.perf_counter() - begun)

    async def run_chunk(self, i: int, step: int, label: str) -> Chunk:
        """Env worker i's envs through the horizon: act, step, repeat."""
        e, chunk = self.cfg.embodied, Chunk()
        env = self.envs[i]
        obs = (await env.call("observations"))[0]
        loop = asyncio.get_running_loop()
        begun = loop.time()
        for t in range(e.horizon):
            act: Action = (await self.policy.call("act", obs, _seed(self.cfg.run.seed, step, i, t)))[0]
            try:
                async with asyncio.timeout(e.step_timeout_s):
                    out: EnvStep = (await env.call("step", act.env_actions))[0]
            except TimeoutError:  # a hung simulator: a fresh worker on the device; the step ends its episodes
                env = await self.restart_env(i)
                chunk.restarts += 1
                fresh = (await env.call("observations"))[0]
                n = len(obs)
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
        self.clock.spans.append(Span("env", [self.placement.env[i]], begun, loop.time(), label))
        return chunk

    async def restart_env(self, i: int) -> WorkerGroup:
        """Env worker i, hung, stopped (its process reaped) and started again on its device
        with seeds of its own (the restart's number)."""
        e, old = self.cfg.embodied, self.envs[i]
        self.progress.note(f"env worker {i} hung past {e.step_timeout_s} s: restarted, its envs reset")
        self.restarts += 1
        self.retired.append(old)
        await self.ctl.stop_group(old)
        self.envs[i] = await self.ctl.spawn(EnvWorker, name=f"env{i}~{self.restarts}", devices=[self.placement.env[i]],
                                            init=self.env_init(i, restart=self.restarts))
        return self.envs[i]

    def env_init(self, i: int, restart: int = 0) -> dict[str, Any]:
        e = self.cfg.embodied
        return {"env_id": e.env_id, "num_envs": e.envs_per_worker,
                "seed": self.cfg.run.seed + 7919 * i + 104_729 * restart}

    def metrics(self, step: int, chunks: list[Chunk], train: dict[str, float], rollout_s: float, trainer_s: float,
                sync_s: float, step_s: float) -> dict[str, Any]:
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
            "env_idle_frac": 1 - sum(c.busy_s for c in chunks) / (len(chunks) * rollout_s),
            "env_errors": sum(c.errors for c in chunks), "env_restarts": sum(c.restarts for c in chunks),
            "rollout_s": rollout_s, "trainer_s": trainer_s, "sync_s": sync_s, "step_time_s": step_s,
            "time": time.time(), **train}

    # --- weights and checkpoints ---------------------------------------------------------
    async def sync_weights(self, version: int, label: str) -> None:
        learner, policy = self.learner, self.policy
        await held(self.ctl, learner, self.clock, label, "sync", lambda: gather_or_cancel([
            learner.call("send_weights", "weight_sync", version),
            policy.call("receive_weights", "weight_sync", version)]), lock=False, component="sync")

    async def checkpoint(self, step: int) -> None:
        path = ckpt.checkpoint_dir(self.run_dir, step)
        steps = await self.learner.call("save_checkpoint", path)
        ckpt.write_state(path, ckpt.CheckpointState(step=step, trainer_step=steps[0], seed=self.cfg.run.seed,
                                                    prompts_per_step=self.cfg.run.prompts_per_step))
        ckpt.prune(self.run_dir, self.cfg.run.keep_checkpoints)

    async def restore(self, path: str, state: ckpt.CheckpointState) -> int:
        """The learner's actor, critic and optimizer from a checkpoint; metrics of later
        steps roll back. The envs start new episodes (their simulator state is not kept)."""
        refused = ckpt.workflow_refused(path, "embodied")  # (dynarl train checks it before any worker starts)
        if refused is not None:
            raise ValueError(f"{path}: {refused}")
        await self.learner.call("load_checkpoint", path)
        jsonl.roll_back(os.path.join(self.run_dir, "metrics.jsonl"), state.step)
        await self.sync_weights(state.step, "restore")
        self.progress.note(f"resumed from {path}: step {state.step}")
        return state.step


def _seed(seed: int, step: int, chunk: int, t: int) -> int:
    """The action sampling seed of chunk `chunk`'s step t of iteration `step`."""
    return ((seed * 1_000_003 + step) * 10_007 + chunk) * 100_003 + t

