NUM_GPUS = 0
"""A step whose loss or gradient norm is not finite (components/workflows/nonfinite.py,
trainer.nonfinite): the native trainer leaves its update out, and the workflow stops
the run before the step's checkpoint or counts the batch as skipped."""

import math

import pytest
import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows import nonfinite
from dynarl.components.workflows.config import load_config
from dynarl.transport.errors import ConfigError

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("metrics, known, bad", [
    pytest.param({"loss": 0.1, "grad_norm": 0.5}, True, [], id="finite"),
    pytest.param({"loss": NAN, "grad_norm": NAN}, True, ["loss nan", "grad_norm nan"], id="nan_step"),
    pytest.param({"loss": 0.1, "grad_norm": INF}, True, ["grad_norm inf"], id="inf_norm"),
    pytest.param({"loss": 0.1, "grad_norm": NAN}, False, [], id="megatron_without_clip_reports_no_norm"),
    pytest.param({"loss": NAN, "grad_norm": NAN}, False, ["loss nan"], id="megatron_nan_loss"),
    pytest.param({"loss": 0.1, "grad_norm": 0.5, "value_loss": NAN, "critic_grad_norm": 1.0}, True,
                 ["value_loss nan"], id="ppo_critic"),
    pytest.param({"loss": 0.1, "grad_norm": None, "reward_mean": NAN}, True, [], id="unwatched_and_missing"),
])
def test_not_finite(metrics, known, bad):
    assert nonfinite.not_finite(metrics, known) == bad


def test_stop_returns_the_error_skip_counts():
    metrics = {"loss": NAN, "grad_norm": NAN}
    error = nonfinite.check(7, metrics, "stop")
    assert isinstance(error, nonfinite.NonFiniteStep)
    assert str(error).startswith("step 7 is not finite (loss nan, grad_norm nan): the run stopped before its checkpoint")
    assert "skipped_batches" not in metrics
    assert nonfinite.check(7, metrics, "skip") is None and metrics["skipped_batches"] == 1
    finite = {"loss": 0.1, "grad_norm": 0.5}
    assert nonfinite.check(8, finite, "stop") is None and "skipped_batches" not in finite
    assert nonfinite.check(8, finite, "skip") is None and finite["skipped_batches"] == 0


def test_config_default_stop_and_skip_refused_with_megatron():
    assert load_config(None, []).trainer.nonfinite == "stop"
    assert load_config(None, [("trainer.nonfinite", "skip")]).trainer.nonfinite == "skip"
    with pytest.raises(ConfigError, match=r"^trainer.nonfinite: skip needs the native trainer"):
        load_config(None, [("trainer.nonfinite", "skip"), ("trainer.backend", "megatron")])
    with pytest.raises(ConfigError, match=r"^trainer.nonfinite"):
        load_config(None, [("trainer.nonfinite", "ignore")])


def test_the_native_trainer_leaves_a_nan_update_out():
    torch.manual_seed(0)
    trainer = NativeTrainer(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]), TrainerConfig(lr=1e-2, micro_batch_size=4))
    batch = TrainBatch(input_ids=[[5, 6, 7, 8], [5, 6, 9, 10]], prompt_lens=[2, 2], advantages=[1.0, -1.0])
    assert math.isfinite(trainer.train_step(batch).grad_norm)
    before = {n: t.clone() for n, t in trainer.export_state_shard().items()}
    poisoned = TrainBatch(input_ids=batch.input_ids, prompt_lens=batch.prompt_lens, advantages=[NAN, 1.0])
    metrics = trainer.train_step(poisoned)
    assert math.isnan(metrics.loss) and math.isnan(metrics.grad_norm)
    after = trainer.export_state_shard()  # the weights, both moments, AdamW's count
    assert after.keys() == before.keys()
    for name in after:
        assert torch.equal(after[name], before[name]) or name == "step", name
    assert math.isfinite(trainer.train_step(batch).loss)  # and it goes on from there
