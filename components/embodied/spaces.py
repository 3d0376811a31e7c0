"""What the embodied policy can take: an environment's spaces, checked at load.

`describe(env_id)` builds one env (in the controller, before any worker starts) and
returns the policy's dimensions, or raises EnvError naming what is wrong: an id
gymnasium does not know, a package it needs that is not installed, an observation
that is not a flat Box, an action that is neither a Box nor a Discrete.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from dynarl.transport.wire import register_struct


class EnvError(ValueError):
    """An environment the embodied workflow cannot run."""


@register_struct(19)
@dataclass(frozen=True, slots=True)
class EnvSpec:
    obs_dim: int
    action_dim: int
    """Box: its size; Discrete: its number of actions."""
    discrete: bool
    low: tuple[float, ...] = ()
    """Box actions: the bounds each sampled action is clipped to before it is stepped."""
    high: tuple[float, ...] = ()

    def to_wire(self) -> list:
        return [self.obs_dim, self.action_dim, self.discrete, list(self.low), list(self.high)]

    @classmethod
    def from_wire(cls, w: list) -> "EnvSpec":
        obs_dim, action_dim, discrete, low, high = w
        return cls(int(obs_dim), int(action_dim), bool(discrete), tuple(map(float, low)), tuple(map(float, high)))


def make_env(env_id: str, **kwargs):
    """gymnasium.make, with "module:Env-v0" importing the module first (gymnasium does
    that too; here its failure becomes an EnvError)."""
    try:
        import gymnasium as gym
    except ImportError:
        raise EnvError("the embodied workflow needs gymnasium: pip install 'dynarl[embodied]'") from None
    if env_id.startswith("dynarl/"):
        import dynarl.components.embodied.flaky  # noqa: F401  registers the fault-injecting envs
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvError(f"{env_id!r}: cannot import {module!r}: {exc}") from None
    try:
        return gym.make(name, **kwargs)
    except gym.error.NameNotFound:
        raise EnvError(f"no environment {name!r} is registered with gymnasium (e.g. Reacher-v5, CartPole-v1)") \
            from None
    except (gym.error.Error, ImportError) as exc:  # a version that does not exist, a missing dependency
        hint = " (MuJoCo envs: pip install 'dynarl[embodied]')" if isinstance(exc, (ImportError,
                                                                                     gym.error.DependencyNotInstalled)) else ""
        raise EnvError(f"{env_id!r}: {exc}{hint}") from None


def spec_of(observation_space, action_space) -> EnvSpec:
    """The policy's dimensions from an env's spaces (pure)."""
    from gymnasium import spaces
    if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1:
        raise EnvError(f"observation space {observation_space} is not a flat Box: the MLP policy takes a vector "
                       "(image or dict observations need a wrapper that flattens them)")
    if isinstance(action_space, spaces.Discrete):
        return EnvSpec(int(observation_space.shape[0]), int(action_space.n), True)
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        return EnvSpec(int(observation_space.shape[0]), int(action_space.shape[0]), False,
                       tuple(float(x) for x in action_space.low), tuple(float(x) for x in action_space.high))
    raise EnvError(f"action space {action_space} is neither a Discrete nor a flat Box")


def describe(env_id: str) -> EnvSpec:
    env = make_env(env_id)
    try:
        return spec_of(env.observation_space, env.action_space)
    finally:
        env.close()
