"""Workload descriptions: the distributions one RL iteration's batch is drawn from.

Frozen dataclasses, validated on construction (ValueError names the field).
`catalog.py` fills them in from docs/COSTMODEL.md's anchors; `generate.py` samples them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dynarl.components.costmodel import get_model


@dataclass(frozen=True, kw_only=True, slots=True)
class LogNormal:
    """exp(N(ln median, sigma)), rounded and clipped to [floor, cap]."""
    median: float
    sigma: float
    cap: float = math.inf
    floor: float = 1.0

    def __post_init__(self) -> None:
        if self.median <= 0:
            raise ValueError(f"median must be > 0, got {self.median}")
        if self.sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {self.sigma}")
        if not 0 <= self.floor <= self.cap:
            raise ValueError(f"need 0 <= floor <= cap, got floor={self.floor}, cap={self.cap}")


@dataclass(frozen=True, kw_only=True, slots=True)
class MathWorkload:
    """Single-turn GRPO: `prompts` prompts x `samples` responses per iteration."""
    name: str
    model: str
    prompts: int = 512
    samples: int = 16
    prompt_tokens: LogNormal
    response_tokens: LogNormal
    prompt_correlation: float = 0.5
    """Share of the log-length variance common to a prompt's samples (0: independent)."""
    rollout_tp: int = 1
    critic: bool = False
    """PPO: a critic of the policy's size computes values and trains beside the policy
    (workflow ppo); False: GRPO."""
    kind: Literal["math"] = "math"
    source: str = ""
    """Where the numbers come from (docs/COSTMODEL.md tags)."""

    def __post_init__(self) -> None:
        _check_common(self.model, self.prompts, self.samples, self.rollout_tp)
        if not 0 <= self.prompt_correlation <= 1:
            raise ValueError(f"prompt_correlation must be in [0, 1], got {self.prompt_correlation}")


@dataclass(frozen=True, kw_only=True, slots=True)
class AgenticWorkload:
    """Multi-turn episodes: generate, call a tool, read its output, repeat."""
    name: str
    model: str
    prompts: int
    samples: int
    prompt_tokens: LogNormal
    mean_turns: float
    """Turns per episode are geometric with this mean, clipped to max_turns."""
    max_turns: int
    first_turn_tokens: LogNormal
    """Generated tokens of turn 0; turn k draws from median x turn_decay**k."""
    turn_decay: float = 1.0
    """Below 1 later turns are shorter (DynaRL's observation 3, what its priority assumes);
    above 1 they grow (an adversarial trace for that assumption)."""
    long_fraction: float = 0.0
    """Bimodal episodes: this fraction of them (drawn per episode) takes
    `long_turn_decay` instead of `turn_decay`, so their later turns grow while the
    others' shrink (an adversarial trace: turn index alone does not tell a turn's length)."""
    long_turn_decay: float = 1.0
    max_response_tokens: int = 1 << 30
    """Generated tokens per episode; turns past it are cut."""
    obs_tokens: LogNormal
    tool_latency_s: LogNormal
    rollout_tp: int = 1
    kind: Literal["agentic"] = "agentic"
    source: str = ""

    def __post_init__(self) -> None:
        _check_common(self.model, self.prompts, self.samples, self.rollout_tp)
        if not 1 <= self.mean_turns <= self.max_turns:
            raise ValueError(f"need 1 <= mean_turns <= max_turns, got {self.mean_turns}, {self.max_turns}")
        if not 0 < self.turn_decay <= 2:
            raise ValueError(f"turn_decay must be in (0, 2], got {self.turn_decay}")
        if not 0 <= self.long_fraction <= 1:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")
        if not 0 < self.long_turn_decay <= 2:
            raise ValueError(f"long_turn_decay must be in (0, 2], got {self.long_turn_decay}")
        if self.max_response_tokens < 1:
            raise ValueError(f"max_response_tokens must be >= 1, got {self.max_response_tokens}")


@dataclass(frozen=True, kw_only=True, slots=True)
class EmbodiedWorkload:
    """RL on a simulator (workflow embodied): `envs_per_device` envs per device step
    `horizon` env steps per iteration; the policy acts once per `action_chunk` steps
    (an action chunk, as OpenVLA-OFT's parallel decoding) on `obs_tokens` tokens per env
    and writes `action_tokens`; the learner runs PPO with a value head over every act."""
    name: str
    model: str
    """The policy's cost-model key (components/costmodel.py MODELS)."""
    env_id: str
    """The simulator whose step cost was measured (`dynarl bench env`)."""
    env_step_s: float
    """One env's step (physics and observation), seconds on one env worker (measured)."""
    envs_per_device: int = 16
    horizon: int = 80
    action_chunk: int = 8
    obs_tokens: int = 286
    action_tokens: int = 56
    rollout_tp: int = 1
    kind: Literal["embodied"] = "embodied"
    source: str = ""

    def __post_init__(self) -> None:
        get_model(self.model)
        for name in ("envs_per_device", "horizon", "action_chunk", "obs_tokens", "action_tokens", "rollout_tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.horizon % self.action_chunk:
            raise ValueError(f"horizon {self.horizon} is not a whole number of action chunks of {self.action_chunk}")
        if not self.env_step_s > 0:
            raise ValueError(f"env_step_s must be > 0, got {self.env_step_s}")

    @property
    def acts(self) -> int:
        """Policy forwards per env per iteration."""
        return self.horizon // self.action_chunk


Workload = MathWorkload | AgenticWorkload | EmbodiedWorkload


def _check_common(model: str, prompts: int, samples: int, rollout_tp: int) -> None:
    get_model(model)
    for name, value in (("prompts", prompts), ("samples", samples), ("rollout_tp", rollout_tp)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
