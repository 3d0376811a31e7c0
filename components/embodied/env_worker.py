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
from dataclasses import dataclass
from typing import Any

import numpy as np

import dynarl
from dynarl.components.embodied.spaces import make_env
from dynarl.transport.wire import register_struct


REPLACE_TRIES = 3


def env_seed(seed: int, rank: int, num_envs: int, i: int) -> int:
    """The first reset's seed of env i of worker `rank`: each env its own."""
    return seed + (rank * num_envs + i) * 1_000_003


def replacement_seed(seed: int, rank: int, num_envs: int, k: int) -> int:
    """The seed of worker `rank`'s k-th rebuilt env: apart from every first seed."""
    return seed + (rank * num_envs + num_envs) * 1_000_003 + 7 * k + 1


def check_slice(first: int, count: int, num_envs: int) -> None:
    if first < 0 or count < 1 or first + count > num_envs:
        raise ValueError(f"{count} actions from env {first}: the worker has {num_envs} envs")


@register_struct(29)
@dataclass(slots=True)
class EnvStep:
    """One step of a worker's envs, as it crosses to the workflow."""
    obs: list[list[float]]
    """The next observations (an ended episode's env already reset)."""
    rewards: list[float]
    terminated: list[bool]
    truncated: list[bool]
    final_obs: list[list[float] | None]
    """A truncated episode's last observation (its value is bootstrapped); else None."""
    episodes: list[list[float]]
    """[return, length, success (-1: not reported)] of each episode that ended."""
    errors: int = 0
    """Envs that crashed (reset) in this step."""
    busy_s: float = 0.0

    def to_wire(self) -> list:
        return [self.obs, self.rewards, self.terminated, self.truncated, self.final_obs, self.episodes, self.errors,
                self.busy_s]

    @classmethod
    def from_wire(cls, w: list) -> "EnvStep":
        return cls(*w)


class EnvWorker(dynarl.Worker):
    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        self.env_id, self.num_envs, self.seed = env_id, num_envs, seed
        self.envs: list[Any] = []
        self.obs: list[np.ndarray] = []
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.resets = 0
        self.replaced = 0
        """Envs rebuilt after a reset failed (each gets a seed of its own: replacement_seed)."""

    async def setup(self) -> None:
        self.envs = [make_env(self.env_id) for _ in range(self.num_envs)]
        self.obs = [self._reset(i, seed=env_seed(self.seed, self.rank, self.num_envs, i)) for i in range(self.num_envs)]
        self.returns, self.lengths = [0.0] * self.num_envs, [0] * self.num_envs

    async def teardown(self) -> None:
        for env in self.envs:
            env.close()

    def _reset(self, i: int, seed: int | None = None) -> np.ndarray:
        self.resets += 1
        obs, _ = self.envs[i].reset(seed=seed)
        return np.asarray(obs, dtype=np.float32)

    def _replace(self, i: int) -> tuple[np.ndarray, int]:
        """Env i rebuilt after its reset failed (the broken one closed as far as it can
        be); up to REPLACE_TRIES fresh envs. Returns its first observation and the
        failures met; raises when no fresh env resets (a simulator that cannot run)."""
        failures = 0
        for _ in range(REPLACE_TRIES):
            try:
                self.envs[i].close()
            except Exception:
                pass
            self.replaced += 1
            try:
                self.envs[i] = make_env(self.env_id)
                return self._reset(i, seed=replacement_seed(self.seed, self.rank, self.num_envs, self.replaced)), \
                    failures
            except Exception as exc:
                failures += 1
                last = exc
        raise RuntimeError(f"env {i} of {self.env_id!r} cannot be reset: {REPLACE_TRIES} fresh envs failed "
                           f"({last!r})")

    def observations(self, first: int = 0, count: int | None = None) -> list[list[float]]:
        """The current observations of envs first .. first + count (default: all; an
        iteration's first)."""
        return [o.tolist() for o in self.obs[first:None if count is None else first + count]]

    async def step(self, actions: list, first: int = 0) -> EnvStep:
        """One step of envs first .. first + len(actions) (a pipeline stage's part of
        this worker's envs; default: all of them)."""
        return await asyncio.to_thread(self._step, actions, first)

    def _step(self, actions: list, first: int = 0) -> EnvStep:
        check_slice(first, len(actions), self.num_envs)
        begun = time.perf_counter()
        rewards, terminated, truncated, final = [], [], [], []
        episodes: list[list[float]] = []
        errors = 0
        for i, action in enumerate(actions, start=first):
            env, last = self.envs[i], self.obs[i]
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
                    obs, failed = self._replace(i)
                    errors += failed
            self.obs[i] = obs
        return EnvStep(obs=self.observations(first, len(actions)), rewards=rewards, terminated=terminated,
                       truncated=truncated, final_obs=final, episodes=episodes, errors=errors,
                       busy_s=time.perf_counter() - begun)
