"""EnvWorker: one env worker of the embodied workflow, stepping its own envs (a chunk).

Each rank holds `num_envs` gymnasium envs and their current observations. `step`
applies one action per env and returns what the learner needs: the next
observations (an ended episode's env already reset), rewards, terminated and
truncated flags, the final observation of each truncated episode (its value is
bootstrapped), and the episodes that ended with their return, length and success.

A crash is one env's, not the job's: an env whose step raises is reset, its
transition ends the episode as truncated (bootstrapped from the last observation it
had), and it is counted in `errors`. A hang is the worker's: the workflow's
deadline on `step` restarts the worker (components/workflows/embodied.py).

The steps run in a thread, so the worker's loop keeps answering heartbeats; the
time spent stepping is the worker's busy time (the workflow reports the envs' idle
share from it).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

import dynarl
from dynarl.components.embodied.spaces import make_env


class EnvWorker(dynarl.Worker):
    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.envs: list[Any] = []
        self.obs: list[np.ndarray] = []
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.resets = 0

    async def setup(self) -> None:
        self.envs = [make_env(self.env_id) for _ in range(self.num_envs)]
        base = self.seed + self.rank * self.num_envs * 1_000_003
        self.obs = [self._reset(i, seed=base + i) for i in range(self.num_envs)]
        self.returns, self.lengths = [0.0] * self.num_envs, [0] * self.num_envs

    async def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def _reset(self, i: int, seed: int | None = None) -> np.ndarray:
        self.resets += 1
        obs, _ = self.envs[i].reset(seed=seed)
        return np.asarray(obs, dtype=np.float32)

    def observations(self) -> list[list[float]]:
        """The envs' current observations (an iteration's first)."""
        return [o.tolist() for o in self.obs]

    async def step(self, actions: list) -> dict[str, Any]:
        return await asyncio.to_thread(self._step, actions)

    def _step(self, actions: list) -> dict[str, Any]:
        if len(actions) != self.num_envs:
            raise ValueError(f"{len(actions)} actions for {self.num_envs} envs")
        begun = time.perf_counter()
        rewards, terminated, truncated, final = [], [], [], []
        episodes: list[list[float]] = []
        errors = 0
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            last = self.obs[i]
            try:
                obs, reward, term, trunc, info = env.step(action)
                obs = np.asarray(obs, dtype=np.float32)
                reward, term, trunc = float(reward), bool(term), bool(trunc)
                if not np.all(np.isfinite(obs)) or not np.isfinite(reward):
                    raise FloatingPointError("a non-finite observation or reward")
            except Exception:  # this env's crash, not the job's: reset it, end the episode, count it
                errors += 1
                obs, reward, term, trunc, info = last, 0.0, False, True, {}
            self.returns[i] += reward
            self.lengths[i] += 1
            rewards.append(reward)
            terminated.append(term)
            truncated.append(trunc and not term)
            final.append(obs.tolist() if trunc and not term else None)
            if term or trunc:
                success = info.get("success", info.get("is_success"))
                episodes.append([self.returns[i], self.lengths[i], -1.0 if success is None else float(success)])
                self.returns[i], self.lengths[i] = 0.0, 0
                try:
                    obs = self._reset(i)
                except Exception:  # a reset that fails: a fresh env
                    errors += 1
                    self.envs[i] = make_env(self.env_id)
                    obs = self._reset(i, seed=self.seed + self.resets)
            self.obs[i] = obs
        return {"obs": [o.tolist() for o in self.obs], "rewards": rewards, "terminated": terminated,
                "truncated": truncated, "final_obs": final, "episodes": episodes, "errors": errors,
                "busy_s": time.perf_counter() - begun}
