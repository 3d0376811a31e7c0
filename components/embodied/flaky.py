"""Fault injection for the embodied workflow: CartPole that fails.

    dynarl/Flaky-v0   every 37th step of an env raises (a simulator crash)
    dynarl/Hang-v0    an env's 60th step blocks for an hour (a hung simulator)

What the env workers must survive (components/embodied/env_worker.py): a crash resets that
env and is counted; a hang past embodied.step_timeout_s restarts the worker.
"""
from __future__ import annotations

import time

import gymnasium as gym
from gymnasium.envs.classic_control.cartpole import CartPoleEnv


class FlakyCartPole(CartPoleEnv):
    def __init__(self, fail_every: int = 37, hang_at: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fail_every, self.hang_at, self.steps = fail_every, hang_at, 0

    def step(self, action):
        self.steps += 1
        if self.hang_at and self.steps == self.hang_at:
            time.sleep(3600)
        if self.fail_every and self.steps % self.fail_every == 0:
            raise RuntimeError(f"simulated simulator crash at step {self.steps}")
        return super().step(action)


if "dynarl/Flaky-v0" not in gym.registry:
    gym.register("dynarl/Flaky-v0", entry_point=FlakyCartPole, max_episode_steps=500)
    gym.register("dynarl/Hang-v0", entry_point=FlakyCartPole, max_episode_steps=500,
                 kwargs={"fail_every": 0, "hang_at": 60})
