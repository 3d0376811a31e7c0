"""RL losses as pure torch functions: GRPO (group advantages, clipped policy
gradient, k3 KL, entropy bonus) and PPO's value side (clipped value loss, GAE).

Per-token functions take tensors of any matching shape and return per-token
values; `token_mean` aggregates. Aggregation is token-mean over the whole
batch: every response token weighs the same, whatever its sample's length.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from dynarl.components.trainer.native.rollout_correction import correct


def grpo_advantages(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-normalised advantages, one per sample.

        A_i = (r_i - mean_g) / (std_g + eps)      g = group of sample i

    std_g is the sample standard deviation (Bessel, divide by n_g - 1), as in
    the GRPO paper's implementations. A group of one sample gets A = 0 (nothing
    to compare with); a group whose rewards are all equal gets A = 0 too.
    """
    rewards = rewards.double()
    advantages = torch.zeros_like(rewards)
    for g in torch.unique(group_ids):
        in_group = group_ids == g
        r = rewards[in_group]
        if r.numel() < 2 or bool((r == r[0]).all()):
            continue  # stays 0; the mean of equal floats can be off by an ulp, so test exactly
        advantages[in_group] = (r - r.mean()) / (r.std(unbiased=True) + eps)
    return advantages.float()


def policy_gradient_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                         clip_eps_low: float, clip_eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-clip policy loss per token, and where clipping was active.

        ratio = exp(logprob - old_logprob)
        loss  = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)

    The clipped branch is active (its gradient is zero) when A > 0 and
    ratio > 1 + eps_high, or A < 0 and ratio < 1 - eps_low.
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped).detach()
    return loss, is_clipped


def decoupled_policy_gradient_loss(logprobs: torch.Tensor, prox_logprobs: torch.Tensor,
                                   behav_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps_low: float,
                                   clip_eps_high: float, weight_cap: float
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled PPO, for samples an older policy (behaviour) generated than the one
    the step starts from (proximal): the clip is taken around the proximal policy and
    the behaviour's part is an importance weight (Hilton et al. 2022, "Batch
    size-invariance for policy optimization", eq. 4; AReaL's asynchronous PPO):

        w_t    = exp(prox_logprob - behav_logprob)           (data: no gradient)
        loss_t = w_t * policy_gradient_loss(logprob, prox_logprob)   if w_t <= weight_cap
                 0                                                   otherwise

    Tokens whose weight exceeds the cap (or is not finite: an overflow, a behaviour
    log-prob of -inf) are left out, as AReaL's behav_imp_weight_cap does (verl's
    truncated IS clamps them instead); they stay in the token-mean's denominator and
    count as not clipped. With behav = prox every weight is exactly 1 and this is
    `policy_gradient_loss`, bit for bit. (rollout_correction.py's mis at weight_cap.)"""
    pg, is_clipped = policy_gradient_loss(logprobs, prox_logprobs, advantages, clip_eps_low, clip_eps_high)
    pg, is_clipped, _ = correct(pg, is_clipped, prox_logprobs, behav_logprobs, "none", weight_cap, weight_cap)
    return pg, is_clipped


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || pi_ref) per token, >= 0 and unbiased:

        d  = ref_logprob - logprob
        k3 = exp(d) - d - 1
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


def entropy_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Entropy of a distribution given as log-probs over the last dim: H = -sum_v p_v log p_v."""
    return -(logp.exp() * logp).sum(dim=-1)


def token_mean(values: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None) -> torch.Tensor:
    """sum(values * mask) / num_tokens; num_tokens defaults to sum(mask).
    Passing the global token count lets micro-batches and DP ranks add their
    parts into exactly the loss of the whole batch."""
    denom = mask.sum() if num_tokens is None else num_tokens
    return (values * mask).sum() / denom


class GRPOLoss(NamedTuple):
    """Token-means over the batch; `loss` is what backward runs on."""
    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_frac: torch.Tensor
    rollout_capped_frac: torch.Tensor
    """Tokens whose rollout-correction weight the cap truncated or dropped (rollout_correction.py)."""


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              mask: torch.Tensor, *, clip_eps_low: float, clip_eps_high: float,
              ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
              entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
              num_tokens: float | None = None, behav_logprobs: torch.Tensor | None = None,
              behav_weight_cap: float = 5.0, rollout_correction: str = "none",
              rollout_correction_cap: float = 2.0) -> GRPOLoss:
    """The GRPO objective, token-mean over `mask`:

        loss = mean_t[ pg_t ] + kl_coef * mean_t[ k3_t ] - entropy_coef * mean_t[ H_t ]

    with pg_t from `policy_gradient_loss`, given the rollout's (behaviour policy's)
    log-probs weighed by rollout_correction.py's `correct` (old_logprobs the
    proximal policy; rollout_correction none: `decoupled_policy_gradient_loss`), and
    k3_t from `kl_k3`. Terms whose inputs are missing are reported as 0.
    """
    pg, is_clipped = policy_gradient_loss(logprobs, old_logprobs, advantages, clip_eps_low, clip_eps_high)
    pg, is_clipped, capped = correct(pg, is_clipped, old_logprobs, behav_logprobs, rollout_correction,
                                     rollout_correction_cap, behav_weight_cap)
    pg_loss = token_mean(pg, mask, num_tokens)
    zero = pg_loss.new_zeros(())
    kl = token_mean(kl_k3(logprobs, ref_logprobs), mask, num_tokens) if ref_logprobs is not None else zero
    ent = token_mean(entropy, mask, num_tokens) if entropy is not None else zero
    loss = pg_loss + kl_coef * kl - entropy_coef * ent
    clip_frac = token_mean(is_clipped.to(pg.dtype), mask, num_tokens)
    return GRPOLoss(loss, pg_loss, kl, ent, clip_frac, token_mean(capped.to(pg.dtype), mask, num_tokens))


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
               clip_eps: float, num_tokens: float | None = None) -> torch.Tensor:
    """PPO clipped value loss, token-mean over `mask`:

        v_clip = old_v + clip(v - old_v, -clip_eps, clip_eps)
        loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)
    """
    v_clipped = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (v_clipped - returns) ** 2)
    return token_mean(per_token, mask, num_tokens)


def gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the last dim ([T] or [B, T]).

        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t

    where t' is the next position with mask 1 (V and A are 0 past the last one),
    so masked tokens (padding, tool observations) are skipped rather than treated
    as steps; they get A = R = 0. Returns (advantages, returns).
    """
    rewards, values, mask = rewards.float(), values.float(), mask.float()
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[..., 0])
    next_adv = torch.zeros_like(rewards[..., 0])
    for t in range(rewards.shape[-1] - 1, -1, -1):
        m = mask[..., t]
        delta = rewards[..., t] + gamma * next_value - values[..., t]
        adv = delta + gamma * lam * next_adv
        advantages[..., t] = adv * m
        # A masked position passes the following step's values through unchanged.
        next_value = m * values[..., t] + (1 - m) * next_value
        next_adv = m * adv + (1 - m) * next_adv
    returns = (advantages + values) * mask
    return advantages, returns


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> float | None:
    """1 - Var(R - V) / Var(R): how much of the returns a critic's values explain (1
    perfect, 0 no better than their mean, < 0 worse); None where Var(R) = 0."""
    if returns.numel() < 2 or float(returns.var()) == 0:
        return None
    return float(1 - (returns - values).var() / returns.var())


def step_advantages(batch, config) -> list:
    """What a GRPO step trains on: the batch's advantages, or group-normalised ones
    from its rewards. Refuses a KL term without reference log-probs."""
    if config.kl_coef > 0 and batch.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs batch.ref_logprobs")
    if batch.advantages is not None:
        return batch.advantages
    return grpo_advantages(torch.tensor(batch.rewards, dtype=torch.float64),
                           torch.tensor(batch.group_ids), config.adv_eps).tolist()


def micro_batch_loss(logprobs, entropy, mb, config, num_tokens: int):
    """The GRPO terms of one micro-batch (on-policy when it has no old log-probs)."""
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    return grpo_loss(logprobs, old, mb.advantages, torch.ones_like(logprobs),
                     clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
                     ref_logprobs=mb.ref_logprobs, kl_coef=config.kl_coef,
                     entropy=entropy, entropy_coef=config.entropy_coef, num_tokens=num_tokens,
                     behav_logprobs=mb.behav_logprobs, behav_weight_cap=config.behav_weight_cap,
                     rollout_correction=config.rollout_correction,
                     rollout_correction_cap=config.rollout_correction_cap)
