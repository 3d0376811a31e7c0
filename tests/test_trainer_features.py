NUM_GPUS = 0
"""The native trainer's optional features, each against the plain trainer it must
equal or contain: packed micro-batches (the same step as padded ones), activation
checkpointing (bitwise the same step), the learning-rate schedule (the step runs at
lr_at), LoRA (only the adapters move; weights handed out merged; checkpoints resume
bitwise)."""

import dataclasses

import pytest
import torch

from dynarl.components.model.lora import apply_lora, merge_lora
from dynarl.components.model.lora_config import LoraConfig
from dynarl.components.model.qwen2 import set_activation_checkpointing
from dynarl.components.trainer.lr_schedule import lr_at
from dynarl.components.trainer.native.trainer import NativeTrainer
from test_trainer import (  # noqa: F401  (one_torch_thread is an autouse fixture)
    flat_params, make_batch, make_config, make_model, one_torch_thread, run_steps)

KEYS = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "tokens")


@pytest.mark.parametrize("budget", [12, 40, 1000])
def test_a_packed_step_equals_the_padded_step(budget):
    padded = NativeTrainer(make_model(0), make_config(eps=1e-4))
    packed = NativeTrainer(make_model(0), make_config(eps=1e-4, max_tokens_per_micro_batch=budget))
    for seed in (1, 2):
        a, b = padded.train_step(make_batch(seed)), packed.train_step(make_batch(seed))
        for key in KEYS:
            assert getattr(b, key) == pytest.approx(getattr(a, key), rel=1e-5, abs=1e-6), key
    torch.testing.assert_close(flat_params(packed), flat_params(padded), rtol=0, atol=1e-6)


def test_activation_checkpointing_leaves_the_step_bitwise_the_same():
    plain = NativeTrainer(make_model(0), make_config())
    model = make_model(0)
    set_activation_checkpointing(model, True)
    checkpointed = NativeTrainer(model, make_config(activation_checkpointing=True))
    assert run_steps(checkpointed, [1, 2]) == run_steps(plain, [1, 2])
    assert torch.equal(flat_params(checkpointed), flat_params(plain))


def test_each_step_runs_at_the_schedule_s_learning_rate():
    config = make_config(lr=1e-3, lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=4, lr_min_ratio=0.1)
    trainer = NativeTrainer(make_model(0), config)
    for step in range(5):
        trainer.train_step(make_batch(step))
        assert {g["lr"] for g in trainer.optimizer.param_groups} == {lr_at(step, config)}
    assert lr_at(0, config) < lr_at(2, config) and lr_at(4, config) < lr_at(2, config)


def lora_model(seed: int = 0):
    return apply_lora(make_model(seed), LoraConfig(rank=4, alpha=8.0), seed=seed)


def test_lora_trains_only_the_adapters_and_hands_out_merged_weights(tmp_path):
    trainer = NativeTrainer(lora_model(), make_config(weight_decay=0.1, kl_coef=0.0))
    base = {k: v.clone() for k, v in trainer.export_state_shard().items() if k.startswith("param/")}
    run_steps(trainer, [1, 2])
    after = trainer.export_state_shard()
    for key, before in base.items():
        moved = not torch.equal(after[key], before)
        assert moved == (".lora_" in key), key  # weight decay or not, a frozen weight stays put
    optimized = sum(len(g["params"]) for g in trainer.optimizer.param_groups)
    assert optimized == sum(".lora_" in k for k in base) == len(trainer.optimizer.state)  # the adapters alone
    handed = [pair for bucket in trainer.named_weights(1 << 40) for pair in bucket]
    names = [n for n, _ in handed]
    assert names == [n for n, _ in make_model(0).named_parameters()]  # the plain model's, in order
    full = {k.removeprefix("param/"): v for k, v in after.items() if k.startswith("param/")}
    for name, tensor in merge_lora(full, 2.0).items():
        assert torch.equal(dict(handed)[name], tensor), name
    trainer.save_checkpoint(str(tmp_path / "ckpt"))
    expected = run_steps(trainer, [3])
    resumed = NativeTrainer(lora_model(seed=5), make_config(weight_decay=0.1, kl_coef=0.0))
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    assert run_steps(resumed, [3]) == expected
    assert torch.equal(flat_params(resumed), flat_params(trainer))


def test_lora_rank_must_be_set_to_adapt():
    with pytest.raises(ValueError, match="rank"):
        apply_lora(make_model(0), dataclasses.replace(LoraConfig(), rank=0))
