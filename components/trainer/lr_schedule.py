"""The learning rate of each optimizer step: a pure function of the step count, so a
checkpoint carries the schedule in its step (a resumed trainer continues it exactly).

`step` is the optimizer step about to be taken, counted from 0: a trainer passes its
`global_step` (the steps it has taken) before it increments it. The schedule's own
count is `step - lr_step_offset`, which leaves the supervised warm start's steps out
(dynarl train sets lr_step_offset to trainer.warmup.steps; the warm start trains
with its own constant lr, `constant_lr`).

    warmup   lr * (i + 1) / lr_warmup_steps for schedule step i < lr_warmup_steps:
             from lr / lr_warmup_steps at the first step to lr at the last warmup
             step (no step is spent at lr 0)
    constant lr after the warmup
    cosine   lr_min + (lr - lr_min) * (1 + cos(pi * d / lr_decay_steps)) / 2 at
             d = i - lr_warmup_steps steps after the warmup, lr_min = lr * lr_min_ratio;
             lr_min from d = lr_decay_steps on

The defaults (constant, no warmup) give `lr` at every step: today's behaviour.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dynarl.components.trainer.base import TrainerConfig

SCHEDULES = ("constant", "cosine")


def lr_at(step: int, config: TrainerConfig) -> float:
    """The learning rate of optimizer step `step` (0 = a trainer's first step)."""
    i = max(step - config.lr_step_offset, 0)  # (a step before the schedule takes its first lr)
    if i < config.lr_warmup_steps:
        return config.lr * (i + 1) / config.lr_warmup_steps
    if config.lr_schedule == "constant":
        return config.lr
    progress = min((i - config.lr_warmup_steps) / config.lr_decay_steps, 1.0)
    lr_min = config.lr * config.lr_min_ratio
    return lr_min + (config.lr - lr_min) * 0.5 * (1.0 + math.cos(math.pi * progress))


def constant_lr(config: TrainerConfig, lr: float) -> TrainerConfig:
    """`config` training at `lr` on every step, without warmup or decay (the warm
    start's supervised steps: their own fixed learning rate)."""
    return dataclasses.replace(config, lr=lr, lr_schedule="constant", lr_warmup_steps=0, lr_decay_steps=0,
                               lr_min_ratio=0.0)


def check_schedule(config: TrainerConfig) -> None:
    """TrainerConfig's schedule fields (its __post_init__): ValueError naming the field."""
    if config.lr_schedule not in SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {SCHEDULES}, got {config.lr_schedule!r}")
    for name in ("lr_warmup_steps", "lr_decay_steps", "lr_step_offset"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not 0.0 <= config.lr_min_ratio <= 1.0:
        raise ValueError(f"lr_min_ratio must be in [0, 1], got {config.lr_min_ratio}")
    if config.lr_schedule == "cosine" and config.lr_decay_steps == 0:
        raise ValueError("lr_decay_steps must be > 0 with lr_schedule 'cosine' (the steps from lr down to "
                         "lr * lr_min_ratio)")
    if config.lr_schedule == "constant" and (config.lr_decay_steps or config.lr_min_ratio):
        raise ValueError(f"lr_decay_steps ({config.lr_decay_steps}) and lr_min_ratio ({config.lr_min_ratio}) "
                         "apply to lr_schedule 'cosine' only: set lr_schedule cosine or leave them 0")
