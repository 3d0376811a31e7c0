"""The `embodied:` section of `dynarl train`: RL on a simulator (workflow embodied,
components/workflows/embodied.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynarl.components import costmodel as cm
from dynarl.core.config_tree import wire_config


@wire_config(31)
@dataclass(kw_only=True, slots=True)
class EmulatedEmbodiedConfig:
    action_dim: int = 7
    """The policy's actions (RLinf's arm: position, rotation, gripper); observations are one
    number (a frame's bytes are not modelled)."""
    model: str = "qwen2.5-7b"
    """The policy's cost-model key (costmodel.MODELS)."""
    device: str = "h100-80gb"
    env_step_s: float = 2.3e-3
    """One env's step on one env worker (`dynarl bench env`: Reacher-v5 with a 224x224 frame)."""
    action_chunk: int = 8
    """Env steps per act (what one emulated env `step` covers)."""
    obs_tokens: int = 286
    action_tokens: int = 56
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        cm.get_model(self.model)
        cm.get_device(self.device)
        for name in ("action_dim", "action_chunk", "obs_tokens", "action_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.env_step_s > 0 or self.time_scale < 0:
            raise ValueError("env_step_s must be > 0 and time_scale >= 0")

    @property
    def spec(self) -> "EnvSpec":
        """The policy's dimensions: a Box of action_dim actions in [-1, 1]."""
        from dynarl.components.embodied.spaces import EnvSpec
        return EnvSpec(1, self.action_dim, False, (-1.0,) * self.action_dim, (1.0,) * self.action_dim)

    @property
    def sequence(self) -> int:
        """Tokens of one act's sequence."""
        return self.obs_tokens + self.action_tokens

    def act_s(self, envs: int) -> float:
        return cm.prefill_time(cm.get_model(self.model), cm.get_device(self.device), envs * self.sequence)

    def env_s(self, envs: int) -> float:
        return envs * self.action_chunk * self.env_step_s

    def learner(self) -> "EmulatedTrainerConfig":
        """The emulated learner's trainer settings (its state's size, its clock)."""
        from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
        return EmulatedTrainerConfig(model=self.model, device=self.device, time_scale=self.time_scale)

    def train_s(self, sequences: int, devices: int) -> float:
        """The value forward and the PPO step over `sequences` acts on `devices` ranks."""
        m, d, tokens = cm.get_model(self.model), cm.get_device(self.device), sequences * self.sequence
        return (cm.logprob_time(m, d, tokens, self.sequence, devices)
                + cm.train_time(m, d, tokens, self.sequence, devices))


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
    learner_ranks: int = 1
    """Data-parallel ranks of the learner (on the learner's device): each trains on its
    part of the envs, gradients averaged over them (gloo all-reduce) at every update."""
    pipeline_stages: int = 1
    """Chunks each env worker's envs are cut into: the worker steps one while the policy
    acts for another (RLinf's pipelining at env-chunk granularity)."""
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
    backend: Literal["gym", "emulated"] = "gym"
    """gym: gymnasium envs, the MLP policy and its learner (components/embodied); emulated:
    their emulated twins on emulated devices (components/embodied/emulated.py, `dynarl sim`)."""
    emulated: EmulatedEmbodiedConfig | None = None
    """backend emulated: the costs (None: the defaults)."""
    step_timeout_s: float = 10.0
    """One env worker's step of its envs: past this it counts as hung, is restarted and
    its envs reset (counted in env_restarts), and the iteration goes on."""

    def __post_init__(self) -> None:
        for name in ("env_workers", "envs_per_worker", "learner_ranks", "pipeline_stages", "horizon", "hidden",
                     "epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in ("gym", "emulated"):
            raise ValueError(f"backend must be 'gym' or 'emulated', got {self.backend!r}")
        for name in ("lr", "clip_eps", "max_grad_norm", "step_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("gamma", "lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("value_coef", "entropy_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.learner_ranks > self.env_workers * self.envs_per_worker:
            raise ValueError(f"learner_ranks {self.learner_ranks}: at most one per env "
                             f"({self.env_workers * self.envs_per_worker})")
        smallest = self.horizon * (self.env_workers * self.envs_per_worker // self.learner_ranks)
        if self.learner_ranks > 1 and smallest < self.minibatches:
            raise ValueError(f"a learner rank's part ({smallest} transitions) is fewer than minibatches "
                             f"{self.minibatches}: fewer learner_ranks or minibatches")
        if self.pipeline_stages > self.envs_per_worker:
            raise ValueError(f"pipeline_stages {self.pipeline_stages} cut {self.envs_per_worker} envs per worker: "
                             "at most envs_per_worker")
        if self.env_workers * self.envs_per_worker * self.horizon < self.minibatches:
            raise ValueError(f"{self.minibatches} minibatches of {self.env_workers * self.envs_per_worker * self.horizon}"
                             " transitions: fewer minibatches")
