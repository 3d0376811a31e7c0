NUM_GPUS = 0
"""Observation tokens are out of the loss: zero gradient at their positions, and
nothing about them (their old/ref log-probs, their advantage) changes the loss."""

import dataclasses

import pytest
import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.losses import micro_batch_loss, step_advantages
from dynarl.components.trainer.native.micro_batch import build_micro_batch
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows.agentic import episode_batch
from dynarl.components.experience import PromptGroup, Sample

TOK = CharTokenizer()
CONFIG = TrainerConfig(lr=1e-2, micro_batch_size=8, kl_coef=0.1, entropy_coef=0.01)


def episode(prompt: str, call: str, obs: str, answer: str) -> tuple[list[int], int, list[int]]:
    p = TOK.encode(prompt, add_bos=True)
    parts = [(TOK.encode(call), 1), (TOK.encode(obs), 0), (TOK.encode(answer) + [TOK.eos_id], 1)]
    return p + [t for ids, _ in parts for t in ids], len(p), [m for ids, m in parts for _ in ids]


def batch(old_obs: float = -1.0, ref_obs: float = -1.0, adv_obs: float = 0.5) -> TrainBatch:
    rows = [episode("12*34=", "[calc 12*34]", "=408\n", "408"), episode("12*34=", "[calc 12*43]", "=516\n", "516"),
            episode("7+5=", "[calc 7+5]", "=12\n", "12"), episode("7+5=", "[calc 7+5]", "!bad\n", "11")]
    ids, plens, masks = zip(*rows)

    def per_token(value_on_model: float, value_on_obs: float) -> list[list[float]]:
        return [[value_on_model if m else value_on_obs for m in mask] for mask in masks]
    advantages = [[a if m else adv_obs for m in mask] for a, mask in zip([1.0, -1.0, 0.7, -0.7], masks)]
    return TrainBatch(input_ids=list(ids), prompt_lens=list(plens), response_mask=list(masks),
                      old_logprobs=per_token(-1.2, old_obs), ref_logprobs=per_token(-1.1, ref_obs),
                      advantages=advantages)


def loss_and_logit_grad(b: TrainBatch) -> tuple[float, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
    mb = build_micro_batch(b, step_advantages(b, CONFIG), range(len(b)), torch.device("cpu"))
    logits = model(mb.input_ids, attention_mask=mb.attention_mask)
    logits.retain_grad()
    logp = torch.log_softmax(logits[:, :-1][mb.loss_mask].float(), dim=-1)
    logprobs = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    terms = micro_batch_loss(logprobs, entropy, mb, CONFIG, b.num_loss_tokens())
    terms.loss.backward()
    return terms.loss.item(), logits.grad, mb.loss_mask


def test_observation_positions_get_zero_gradient():
    b = batch()
    _, grad, loss_mask = loss_and_logit_grad(b)
    for i, (ids, plen, mask) in enumerate(zip(b.input_ids, b.prompt_lens, b.response_mask)):
        for k, m in enumerate(mask):
            g = grad[i, plen + k - 1]  # the logits that predict response token k
            assert bool(loss_mask[i, plen + k - 1]) == bool(m)
            assert (g.abs().sum() > 0) if m else torch.all(g == 0), (i, k, m)


@pytest.mark.parametrize("change", [dict(old_obs=-9.0), dict(ref_obs=-0.01), dict(adv_obs=-50.0)])
def test_values_at_observations_do_not_change_the_loss(change):
    assert loss_and_logit_grad(batch(**change))[0] == loss_and_logit_grad(batch())[0]


def test_loss_counts_model_tokens_only():
    b = batch()
    model_tokens = sum(len(TOK.encode(c)) + len(TOK.encode(a)) + 1 for c, a in
                       [("[calc 12*34]", "408"), ("[calc 12*43]", "516"), ("[calc 7+5]", "12"), ("[calc 7+5]", "11")])
    assert b.num_loss_tokens() == model_tokens
    unmasked = dataclasses.replace(b, response_mask=None)
    assert unmasked.num_loss_tokens() == model_tokens + len("=408\n=516\n=12\n!bad\n")


def test_a_trainer_step_ignores_what_observations_carry():
    """Two batches that differ only at masked positions give the same new weights."""
    weights = []
    for b in (batch(), batch(old_obs=-7.0, ref_obs=-0.2, adv_obs=9.0)):
        torch.manual_seed(0)
        trainer = NativeTrainer(Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]), CONFIG)
        trainer.train_step(b)
        weights.append(torch.cat([t.flatten() for bucket in trainer.named_weights(1 << 40) for _, t in bucket]))
    assert torch.equal(weights[0], weights[1])


def test_episode_batch_lines_masks_up_with_the_canonical_order():
    ids_a, plen, mask_a = episode("12*34=", "[calc 12*34]", "=408\n", "408")
    ids_b, _, mask_b = episode("12*34=", "[calc 12*34]", "!x\n", "4")
    prompt = ids_a[:plen]
    groups = [  # out of order on purpose: the batch sorts groups by index
        PromptGroup(1, "p1", "", prompt, [Sample("p1/0", 0, output_ids=ids_b[plen:], mask=mask_b, reward=0.0,
                                                 old_logprobs=[0.0] * len(mask_b))]),
        PromptGroup(0, "p0", "", prompt, [Sample("p0/0", 0, output_ids=ids_a[plen:], mask=mask_a, reward=1.0,
                                                 old_logprobs=[0.0] * len(mask_a))])]
    b = episode_batch(groups, with_ref=False)
    assert b.input_ids == [ids_a, ids_b] and b.response_mask == [mask_a, mask_b] and b.rewards == [1.0, 0.0]


def test_an_overlapped_steps_episode_batch_keeps_its_masks_with_the_behaviour_log_probs():
    """max_staleness 1 trains episodes played on older weights: the batch carries the
    rollout's own log-probs (observations 0.0) and the observations stay out of the loss."""
    ids, plen, mask = episode("7+5=", "[calc 7+5]", "=12\n", "12")
    behav = [-0.5 if m else 0.0 for m in mask]
    group = PromptGroup(0, "p0", "", ids[:plen], [Sample("p0/0", 0, output_ids=ids[plen:], mask=mask, reward=1.0,
                                                         logprobs=behav, old_logprobs=[-0.4] * len(mask))])
    b = episode_batch([group], with_ref=False, behaviour=True)
    assert b.response_mask == [mask] and b.behav_logprobs == [behav]
    assert episode_batch([group], with_ref=False).behav_logprobs is None
