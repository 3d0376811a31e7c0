"""The `embodied:` section of `dynarl train`: RL on a simulator (workflow embodied,
components/workflows/embodied.py)."""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.core.config_tree import wire_config


@wire_config(28)
@dataclass(kw_only=True, slots=True)
class EmbodiedSection:
    env_id: str = "Reacher-v5"
    """A gymnasium environment id with a flat Box observation and a Box or Discrete
    action (Reacher-v5: MuJoCo's two-joint arm reaching a target; `pip install
    'dynarl[embodied]'`). "module:Env-v0" imports the module first (its registration)."""
    env_workers: int = 2
    """Env worker processes; each steps its own envs (a chunk), so the policy serves one
    chunk while another steps: the pipelining granularity."""
    envs_per_worker: int = 8
    """Vectorised envs per worker."""
    horizon: int = 128
    """Steps every env takes per iteration (episodes carry over iterations)."""
    hidden: int = 64
    """Width of the actor's and the critic's two hidden layers (tanh MLPs)."""
    lr: float = 3e-4
    epochs: int = 10
    """PPO passes over an iteration's transitions."""
    minibatches: int = 4
    gamma: float = 0.99
    lam: float = 0.95
    clip_eps: float = 0.2
    value_coef: float = 0.5
    entropy_coef: float = 0.0
    max_grad_norm: float = 0.5
    step_timeout_s: float = 10.0
    """One env worker's step of its envs: past this it counts as hung, is restarted and
    its envs reset (counted in env_restarts), and the iteration goes on."""

    def __post_init__(self) -> None:
        for name in ("env_workers", "envs_per_worker", "horizon", "hidden", "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("lr", "clip_eps", "max_grad_norm", "step_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.env_workers * self.envs_per_worker * self.horizon < self.minibatches:
            raise ValueError(f"{self.minibatches} minibatches of {self.env_workers * self.envs_per_worker * self.horizon}"
                             " transitions: fewer minibatches")
