"""lr_at (trainer/lr_schedule.py): the learning rate of each optimizer step, a pure
function of the step count; its TrainerConfig fields, their checks, the warm start's
constant lr and the offset dynarl train sets. The megatron trainer's use of it (and a
resumed run's) is in test_megatron_schedule.py."""
NUM_GPUS = 0

import math

import pytest

from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.lr_schedule import constant_lr, lr_at
from dynarl.components.workflows.config import load_config
from dynarl.transport.wire import Codec

LR = 0.4


def cosine(progress: float, ratio: float) -> float:
    return LR * (ratio + (1 - ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.parametrize("fields, step, expected", [
    # defaults: lr at every step (today's behaviour)
    ({}, 0, LR),
    ({}, 10_000, LR),
    # linear warmup from lr / W at the first step to lr at the last warmup step
    ({"lr_warmup_steps": 4}, 0, LR / 4),
    ({"lr_warmup_steps": 4}, 1, LR * 2 / 4),
    ({"lr_warmup_steps": 4}, 3, LR),                      # warmup end
    ({"lr_warmup_steps": 4}, 4, LR),                      # constant after it
    ({"lr_warmup_steps": 4}, 500, LR),
    # cosine, warmup 0: lr at step 0, the mean of lr and the floor halfway, then the floor
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 0, LR),
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 5, LR * (0.1 + 1) / 2),  # midpoint
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 3, cosine(0.3, 0.1)),
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 10, LR * 0.1),        # decay end
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 11, LR * 0.1),        # after it
    ({"lr_schedule": "cosine", "lr_decay_steps": 10, "lr_min_ratio": 0.1}, 10_000, LR * 0.1),
    # cosine after a warmup: the decay counts from the warmup's end
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 0, LR / 2),
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 1, LR),
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 2, LR),
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 4, LR / 2),            # midpoint
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 6, 0.0),
    ({"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 4}, 99, 0.0),
    ({"lr_schedule": "cosine", "lr_decay_steps": 4, "lr_min_ratio": 1.0}, 2, LR),                 # a flat floor
    # an offset (the warm start's steps): the schedule's step 0 is optimizer step 3
    ({"lr_warmup_steps": 2, "lr_step_offset": 3}, 3, LR / 2),
    ({"lr_warmup_steps": 2, "lr_step_offset": 3}, 4, LR),
    ({"lr_warmup_steps": 2, "lr_step_offset": 3}, 0, LR / 2),  # (before it: the first scheduled lr)
    ({"lr_schedule": "cosine", "lr_decay_steps": 4, "lr_step_offset": 3}, 5, LR / 2),
])
def test_lr_at(fields, step, expected):
    assert lr_at(step, TrainerConfig(lr=LR, **fields)) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("fields", [
    {}, {"lr_warmup_steps": 3}, {"lr_schedule": "cosine", "lr_warmup_steps": 2, "lr_decay_steps": 5},
    {"lr_schedule": "cosine", "lr_decay_steps": 7, "lr_min_ratio": 0.3}])
def test_the_lr_never_exceeds_lr_nor_falls_below_the_floor(fields):
    config = TrainerConfig(lr=LR, **fields)
    lrs = [lr_at(step, config) for step in range(40)]
    assert lrs[0] > 0  # no step is spent at lr 0
    assert all(LR * config.lr_min_ratio - 1e-15 <= lr <= LR * (1 + 1e-12) for lr in lrs)
    assert max(lrs) == pytest.approx(LR)
    after_warmup = lrs[config.lr_warmup_steps:]
    assert all(b <= a + 1e-15 for a, b in zip(after_warmup, after_warmup[1:]))  # never rises again


@pytest.mark.parametrize("fields, field", [
    ({"lr_schedule": "linear"}, "lr_schedule"),
    ({"lr_schedule": "cosine"}, "lr_decay_steps"),  # cosine needs its decay length
    ({"lr_warmup_steps": -1}, "lr_warmup_steps"),
    ({"lr_warmup_steps": 1.5}, "lr_warmup_steps"),
    ({"lr_schedule": "cosine", "lr_decay_steps": -2}, "lr_decay_steps"),
    ({"lr_step_offset": -1}, "lr_step_offset"),
    ({"lr_schedule": "cosine", "lr_decay_steps": 4, "lr_min_ratio": 1.5}, "lr_min_ratio"),
    ({"lr_schedule": "cosine", "lr_decay_steps": 4, "lr_min_ratio": -0.1}, "lr_min_ratio"),
    ({"lr_decay_steps": 4}, "lr_decay_steps"),  # constant: a decay is a mistake
    ({"lr_min_ratio": 0.5}, "lr_min_ratio"),
])
def test_invalid_schedule_fields_are_refused_naming_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        TrainerConfig(**fields)


def test_a_schedule_crosses_the_wire_and_defaults_are_todays_config():
    codec = Codec(b"k" * 16)
    config = TrainerConfig(lr=LR, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=9, lr_min_ratio=0.2,
                           lr_step_offset=5, activation_checkpointing=True)
    assert codec.decode(codec.encode(config)) == config
    defaults = TrainerConfig()
    assert (defaults.lr_schedule, defaults.lr_warmup_steps, defaults.lr_decay_steps, defaults.lr_min_ratio,
            defaults.lr_step_offset, defaults.activation_checkpointing) == ("constant", 0, 0, 0.0, 0, False)


def test_the_warm_start_trains_at_its_own_constant_lr():
    config = TrainerConfig(lr=LR, lr_schedule="cosine", lr_warmup_steps=3, lr_decay_steps=5, lr_min_ratio=0.1,
                           lr_step_offset=4, kl_coef=0.2)
    warm = constant_lr(config, 0.01)
    assert [lr_at(step, warm) for step in range(12)] == [0.01] * 12
    assert warm.kl_coef == config.kl_coef and warm.lr_schedule == "constant"


@pytest.mark.parametrize("warmup_steps", [0, 7])
def test_dynarl_train_starts_the_schedule_after_the_warm_start(warmup_steps):
    cfg = load_config({"trainer": {"warmup": {"steps": warmup_steps},
                                   "engine": {"lr": LR, "lr_warmup_steps": 2, "lr_step_offset": 99}}})
    assert cfg.trainer.engine.lr_step_offset == warmup_steps  # (a value given is replaced)
    assert cfg.critic.engine.lr_step_offset == 0  # the critic's trainer starts after the warm start
    # the first RL step: the trainer has taken the warm start's steps
    assert lr_at(warmup_steps, cfg.trainer.engine) == pytest.approx(LR / 2)
