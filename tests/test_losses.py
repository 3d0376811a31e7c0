NUM_GPUS = 0

import math

import pytest
import torch

from dynarl.components.trainer.native.losses import (
    decoupled_policy_gradient_loss, entropy_from_logprobs, gae, grpo_advantages, grpo_loss, kl_k3, policy_gradient_loss,
    token_mean, value_loss)

S3 = math.sqrt(0.5)  # (x - mean) / std for a two-sample group


@pytest.mark.parametrize("rewards, groups, eps, expected", [
    pytest.param([1, 2, 3, 5, 5], [0, 0, 0, 1, 1], 0.0, [-1, 0, 1, 0, 0], id="mean2_std1_and_equal_group"),
    pytest.param([1, 0, 1, 0], [4, 4, 4, 4], 0.0, [0.5 / math.sqrt(1 / 3), -0.5 / math.sqrt(1 / 3)] * 2,
                 id="bessel_std"),
    pytest.param([0, 10, 1, 20], [7, 3, 7, 3], 0.0, [-S3, -S3, S3, S3], id="interleaved_groups"),
    pytest.param([0, 2], [0, 0], 0.5, [-1 / (math.sqrt(2) + 0.5), 1 / (math.sqrt(2) + 0.5)], id="eps_in_denominator"),
    pytest.param([3.0, 1.0, 4.0], [0, 1, 2], 1e-6, [0, 0, 0], id="singletons_get_zero"),
])
def test_grpo_advantages(rewards, groups, eps, expected):
    got = grpo_advantages(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups), eps)
    assert got.tolist() == pytest.approx(expected, abs=1e-6)


# eps_low = 0.2, eps_high = 0.28 (clip-higher) throughout.
@pytest.mark.parametrize("ratio, adv, loss, clipped", [
    pytest.param(1.0, 2.0, -2.0, False, id="on_policy"),
    pytest.param(1.1, 1.0, -1.1, False, id="inside_range"),
    pytest.param(1.5, 1.0, -1.28, True, id="pos_adv_above_high_clips"),
    pytest.param(1.5, -1.0, 1.5, False, id="neg_adv_above_high_keeps_gradient"),
    pytest.param(0.5, -1.0, 0.8, True, id="neg_adv_below_low_clips"),
    pytest.param(0.5, 1.0, -0.5, False, id="pos_adv_below_low_keeps_gradient"),
])
def test_policy_gradient_clipping(ratio, adv, loss, clipped):
    old = torch.tensor([-1.0], dtype=torch.float64)
    logprob = (old + math.log(ratio)).requires_grad_(True)
    got, is_clipped = policy_gradient_loss(logprob, old, torch.tensor([adv], dtype=torch.float64), 0.2, 0.28)
    assert got.item() == pytest.approx(loss, abs=1e-9)
    assert bool(is_clipped.item()) is clipped
    got.sum().backward()
    # d/d logprob of -ratio * A is -ratio * A; the clipped branch has no gradient.
    assert logprob.grad.item() == pytest.approx(0.0 if clipped else -ratio * adv, abs=1e-9)


@pytest.mark.parametrize("p, p_ref, expected", [
    pytest.param(0.5, 0.25, 0.5 + math.log(2) - 1, id="ref_half_as_likely"),
    pytest.param(0.25, 0.5, 2 - math.log(2) - 1, id="ref_twice_as_likely"),
    pytest.param(0.3, 0.3, 0.0, id="equal"),
])
def test_kl_k3(p, p_ref, expected):
    got = kl_k3(torch.tensor([math.log(p)], dtype=torch.float64), torch.tensor([math.log(p_ref)], dtype=torch.float64))
    assert got.item() == pytest.approx(expected, abs=1e-12)
    assert got.item() >= 0


def test_entropy_from_logprobs():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9], [math.log(3), 0.0, -1e9, -1e9]])
    expected = [math.log(4), 0.0, -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))]
    assert entropy_from_logprobs(torch.log_softmax(logits, dim=-1)).tolist() == pytest.approx(expected, abs=1e-6)


def test_token_mean_uses_mask_or_given_count():
    values, mask = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 0.0, 1.0, 1.0])
    assert token_mean(values, mask).item() == pytest.approx(8 / 3)
    assert token_mean(values, mask, num_tokens=4).item() == pytest.approx(2.0)


def test_grpo_loss_combines_terms():
    lp = torch.log(torch.tensor([0.5, 0.5, 0.2], dtype=torch.float64))
    old = torch.log(torch.tensor([0.5, 0.25, 0.2], dtype=torch.float64))  # ratios 1, 2, 1
    ref = torch.log(torch.tensor([0.25, 0.5, 0.2], dtype=torch.float64))
    adv = torch.tensor([1.0, 1.0, -3.0], dtype=torch.float64)
    ent = torch.tensor([1.0, 2.0, 6.0], dtype=torch.float64)
    mask = torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)  # third token out of the loss
    out = grpo_loss(lp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2, ref_logprobs=ref, kl_coef=0.1,
                    entropy=ent, entropy_coef=0.05)
    pg = (-1.0 + -1.2) / 2  # second token: ratio 2 clipped to 1.2
    kl = (0.5 + math.log(2) - 1 + 0.0) / 2
    assert out.pg_loss.item() == pytest.approx(pg)
    assert out.kl.item() == pytest.approx(kl)
    assert out.entropy.item() == pytest.approx(1.5)
    assert out.clip_frac.item() == pytest.approx(0.5)
    assert out.loss.item() == pytest.approx(pg + 0.1 * kl - 0.05 * 1.5)


def test_grpo_loss_without_ref_or_entropy_reports_zero():
    lp = torch.zeros(2)
    out = grpo_loss(lp, lp, torch.ones(2), torch.ones(2), clip_eps_low=0.2, clip_eps_high=0.2)
    assert (out.kl.item(), out.entropy.item()) == (0.0, 0.0)
    assert out.loss.item() == pytest.approx(-1.0)


@pytest.mark.parametrize("v, old_v, ret, expected", [
    pytest.param(2.0, 1.0, 1.5, 0.5 * 0.25, id="unclipped_larger"),
    pytest.param(1.5, 1.0, 2.0, 0.5 * 0.64, id="clipped_larger"),
    pytest.param(0.0, 1.0, 2.0, 0.5 * 4.0, id="below_range"),
    pytest.param(1.1, 1.0, 3.0, 0.5 * 1.9 ** 2, id="inside_range"),
])
def test_value_loss_clipping(v, old_v, ret, expected):
    t = lambda x: torch.tensor([x], dtype=torch.float64)
    assert value_loss(t(v), t(old_v), t(ret), t(1.0), clip_eps=0.2).item() == pytest.approx(expected)


@pytest.mark.parametrize("rewards, values, mask, gamma, lam, adv, ret", [
    pytest.param([0, 0, 1], [0.5, 0.6, 0.7], [1, 1, 1], 1.0, 1.0, [0.5, 0.4, 0.3], [1, 1, 1], id="monte_carlo"),
    pytest.param([0, 0, 1], [0.5, 0.6, 0.7], [1, 1, 1], 0.9, 0.5, [0.11425, 0.165, 0.3], [0.61425, 0.765, 1.0],
                 id="discounted"),
    pytest.param([0, 0, 1], [0.5, 0.6, 0.7], [1, 0, 1], 1.0, 1.0, [0.5, 0.0, 0.3], [1, 0, 1],
                 id="masked_observation_skipped"),
    pytest.param([0, 1, 5], [0.5, 0.6, 9.0], [1, 1, 0], 1.0, 1.0, [0.5, 0.4, 0.0], [1, 1, 0], id="right_padding"),
])
def test_gae(rewards, values, mask, gamma, lam, adv, ret):
    t = lambda x: torch.tensor(x, dtype=torch.float32)
    got_adv, got_ret = gae(t(rewards), t(values), t(mask), gamma, lam)
    assert got_adv.tolist() == pytest.approx(adv, abs=1e-6)
    assert got_ret.tolist() == pytest.approx(ret, abs=1e-6)


def test_gae_batched_rows_are_independent():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 0.6, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, _ = gae(rewards, values, mask, 1.0, 1.0)
    assert adv.tolist() == [pytest.approx([0.5, 0.4, 0.3]), pytest.approx([0.5, 0.4, 0.0])]


# --- decoupled PPO (algorithm.max_staleness > 0) --------------------------------------

@pytest.mark.parametrize("behav_gap, ratio, adv, loss, kept", [
    # behav_gap = prox - behav (the behaviour weight is exp of it); ratio = exp(logp - prox)
    (0.0, 1.0, 1.0, -1.0, True),                   # on-policy: weight 1, plain PPO
    (math.log(2.0), 1.0, 1.0, -2.0, True),         # the proximal policy likes it twice as much
    (math.log(0.5), 1.5, 1.0, -0.5 * 1.2, True),   # weight 1/2 times the clipped term (1 + 0.2)
    (math.log(4.0), 0.5, -1.0, 4.0 * 0.8, True),   # clipped below for A < 0, weight 4
    (math.log(6.0), 1.0, 1.0, 0.0, False),         # weight 6 > cap 5: left out
])
def test_decoupled_policy_gradient_loss(behav_gap, ratio, adv, loss, kept):
    prox = torch.tensor([-1.0], dtype=torch.float64)
    logp = prox + math.log(ratio)
    out, clipped = decoupled_policy_gradient_loss(logp, prox, prox - behav_gap, torch.tensor([adv], dtype=torch.float64),
                                                  0.2, 0.2, 5.0)
    assert out.item() == pytest.approx(loss)
    if not kept:
        assert not clipped.item()


def test_the_decoupled_loss_is_ppo_bit_for_bit_when_the_behaviour_policy_is_the_proximal_one():
    """max_staleness 0 (or a sample the step's own weights generated): GRPO's loss exactly."""
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(64, generator=g, dtype=torch.float32) * 0.1 - 2.0
    old = logp + torch.randn(64, generator=g) * 0.05
    adv = torch.randn(64, generator=g)
    plain, plain_clipped = policy_gradient_loss(logp, old, adv, 0.2, 0.28)
    decoupled, clipped = decoupled_policy_gradient_loss(logp, old, old.clone(), adv, 0.2, 0.28, 5.0)
    assert torch.equal(plain, decoupled) and torch.equal(plain_clipped, clipped)
    mask = torch.ones_like(logp)
    a = grpo_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28)
    b = grpo_loss(logp, old, adv, mask, clip_eps_low=0.2, clip_eps_high=0.28, behav_logprobs=old.clone())
    assert torch.equal(a.loss, b.loss) and torch.equal(a.clip_frac, b.clip_frac)


def test_the_behaviour_weight_carries_no_gradient():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    prox = torch.tensor([-1.1, -1.9])
    behav = torch.tensor([-1.5, -1.0])
    out, _ = decoupled_policy_gradient_loss(logp, prox, behav, torch.tensor([1.0, 1.0]), 0.2, 0.2, 5.0)
    out.sum().backward()
    # d/dlogp of -w * exp(logp - prox) (unclipped here) is -w * ratio, w = exp(prox - behav)
    expected = [-(math.exp(-1.1 + 1.5) * math.exp(-1.0 + 1.1)), -(math.exp(-1.9 + 1.0) * math.exp(-2.0 + 1.9))]
    assert logp.grad.tolist() == pytest.approx(expected)


def test_a_token_the_behaviour_policy_gave_no_chance_leaves_no_nan_in_the_gradient():
    """exp(prox - behav) overflows (behav = -inf, or very far below): the token is left
    out, and the backward pass stays finite (0 * inf would be NaN)."""
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    prox = torch.tensor([-1.0, -2.0])
    behav = torch.tensor([float("-inf"), -200.0])
    out, clipped = decoupled_policy_gradient_loss(logp, prox, behav, torch.tensor([1.0, -1.0]), 0.2, 0.2, 5.0)
    out.sum().backward()
    assert out.tolist() == [0.0, 0.0] and not clipped.any()
    assert torch.isfinite(logp.grad).all() and logp.grad.tolist() == [0.0, 0.0]
