"""Activation checkpointing in Qwen2Model (TrainerConfig.activation_checkpointing):
the same loss and gradients, the same parameter names, each layer recomputed in the
backward only while training with grad, and the rollout's paged forward untouched."""
NUM_GPUS = 0

import pytest
import torch
from torch import nn

from dynarl.components.engine_factory import trainer_model
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.paged_attention import KVCache, PagedContext
from dynarl.components.model.qwen2 import DecoderLayer, Qwen2ForCausalLM, set_activation_checkpointing
from dynarl.components.model.spec import ModelSpec
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.native.critic import value_head
from test_trainer import one_torch_thread  # noqa: F401  (autouse fixture)

CONFIG = TINY_CONFIGS["tiny-0.5m"]


def make_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(CONFIG)


def padded_batch(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Left and right padding, so the attention mask path runs too."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, CONFIG.vocab_size, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    mask[2, -7:] = 0
    return ids, mask


def count_layer_calls(model: nn.Module) -> list[int]:
    """calls[0] grows by one each time any decoder layer runs (a forward or a recompute)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1
    for module in model.modules():
        if isinstance(module, DecoderLayer):
            module.register_forward_pre_hook(hook)
    return calls


def loss_and_grads(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad(set_to_none=True)
    logits = model(ids, attention_mask=mask)
    loss = (logits.float().log_softmax(-1)[..., 0] * mask).sum() / mask.sum() + logits.pow(2).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("make", [make_model, lambda: value_head(make_model())], ids=["causal_lm", "value_head"])
def test_loss_and_every_gradient_are_bitwise_equal(make):
    model = make().train()
    ids, mask = padded_batch()
    calls = count_layer_calls(model)
    loss_off, grads_off = loss_and_grads(model, ids, mask)
    plain_calls = calls[0]
    set_activation_checkpointing(model, True)
    calls[0] = 0
    loss_on, grads_on = loss_and_grads(model, ids, mask)
    assert plain_calls == CONFIG.num_hidden_layers
    assert calls[0] == 2 * CONFIG.num_hidden_layers  # each layer recomputed once in the backward
    assert torch.equal(loss_on, loss_off)
    assert grads_on.keys() == grads_off.keys()
    for name, grad in grads_off.items():
        assert torch.equal(grads_on[name], grad), name


def test_parameter_and_state_names_do_not_change():
    model = make_model()
    names, keys = [n for n, _ in model.named_parameters()], list(model.state_dict())
    set_activation_checkpointing(model, True)
    assert [n for n, _ in model.named_parameters()] == names
    assert list(model.state_dict()) == keys
    assert not any("checkpoint" in n for n in keys)


@pytest.mark.parametrize("mode, grad, expected", [
    ("train", True, 2), ("eval", True, 1), ("train", False, 1)])
def test_recomputes_only_in_training_with_grad(mode, grad, expected):
    model = make_model()
    getattr(model, mode)()
    set_activation_checkpointing(model, True)
    calls = count_layer_calls(model)
    ids, mask = padded_batch()
    with torch.set_grad_enabled(grad):
        out = model(ids, attention_mask=mask)
    if grad:
        out.sum().backward()
    assert calls[0] == expected * CONFIG.num_hidden_layers


def paged_run(model: Qwen2ForCausalLM) -> tuple[list[torch.Tensor], KVCache]:
    """A prefill of three sequences into a block cache, then two batched decodes."""
    block = 4
    lengths = [9, 2, 13]
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(3, CONFIG.vocab_size, (n + 2,), generator=g).tolist() for n in lengths]
    tables = [[3 * b + i for i in range(-(-(n + 2) // block))] for b, n in enumerate(lengths)]
    cache = KVCache.allocate(CONFIG.num_hidden_layers, 16, block, CONFIG.num_key_value_heads, CONFIG.head_dim)
    ctx = PagedContext.build(lengths, lengths, tables, block)
    logits = [model.forward_paged(torch.tensor([t for s, n in zip(seqs, lengths) for t in s[:n]]), cache, ctx)]
    for step in range(2):
        ctx = PagedContext.build([1] * 3, [n + step + 1 for n in lengths], tables, block)
        logits.append(model.forward_paged(torch.tensor([s[n + step] for s, n in zip(seqs, lengths)]), cache, ctx))
    return [t.detach() for t in logits], cache


@pytest.mark.parametrize("mode", ["inference", "train_with_grad"])
def test_paged_forward_is_unchanged(mode):
    """The rollout's path: under inference mode (as the engine runs it), and even a model
    left in training mode with grad on gives the same logits and KV cache."""
    model = make_model()
    context = torch.inference_mode if mode == "inference" else torch.enable_grad
    model.train(mode != "inference")
    with context():
        plain_logits, plain_cache = paged_run(model)
        set_activation_checkpointing(model, True)
        ckpt_logits, ckpt_cache = paged_run(model)
    for a, b in zip(ckpt_logits, plain_logits):
        assert torch.equal(a, b)
    assert torch.equal(ckpt_cache.k, plain_cache.k) and torch.equal(ckpt_cache.v, plain_cache.v)


def test_trainer_model_follows_the_config_and_a_model_without_decoder_is_refused():
    spec = ModelSpec(name="tiny-0.5m")
    assert trainer_model(spec, "cpu", TrainerConfig(activation_checkpointing=True)).model.gradient_checkpointing
    assert not trainer_model(spec, "cpu", TrainerConfig()).model.gradient_checkpointing
    with pytest.raises(ValueError, match="no Qwen2Model"):
        set_activation_checkpointing(nn.Linear(2, 2), True)
    set_activation_checkpointing(nn.Linear(2, 2), False)  # (nothing to turn off)
