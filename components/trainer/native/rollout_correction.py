"""Correcting the loss for the rollout engine's log-probs (TrainerConfig.rollout_correction,
algorithm.rollout_correction), as pure torch functions.

The rollout engine (vLLM, SGLang, the native paged engine) samples a token y_t with its
own numerics: its probability pi_rollout(y_t) is not exactly the trainer's pi_old(y_t)
even with the same weights (kernels, dtype, batch shape), and with max_staleness > 0 the
weights themselves are older. The policy gradient assumes the tokens came from pi_old;
importance sampling reweighs each token by

    w_t = pi_old(y_t) / pi_rollout(y_t) = exp(old_logprob_t - rollout_logprob_t)

(old: the inference stage's recomputation with the trainer's weights; no gradient
flows through w). It multiplies the objective's per-token policy term: for PPO-clip
(Hilton et al. 2022's decoupled PPO, with pi_old as the proximal policy)

    loss_t = w_t * -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t),  r_t = pi / pi_old

and likewise gspo's and cispo's per-token terms (objectives.py). An unbounded w has
unbounded variance, so each mode bounds it at C = rollout_correction_cap:

    tis   truncated IS: w_t <- min(w_t, C)
          (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL
          Training", fengyao.notion.site/off-policy-rl; verl's rollout_is_mode truncate,
          verl PR #2953, threshold 2.0 in its examples; TRL's vllm_importance_sampling_
          correction, PR #4530, mode token_truncate)
    mis   masked IS: w_t <- w_t if w_t <= C, else 0: the token leaves the loss
          (Liu, Li et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from
          the Training-Inference Mismatch"; verl's rollout_is_mode mask; TRL's token_mask)

Both act per token. Per sequence (verl's rollout_is_level sequence, TRL's default
sequence_mask) the weight is the product prod_t w_t, which compounds a small systematic
per-token gap with length: a gap of -0.003 per token is a weight of exp(-3.6) = 0.03 on
1,200 tokens, so a sequence cap drops or silences long responses as a group while
their tokens are individually close; token-level weights keep each decision to the
token that is off. Token-level also matches the decoupled-PPO cap already here (AReaL's
behav_imp_weight_cap, which masks per token), is independent of how samples are cut
into micro-batches, and gives every objective the same per-token factor. The price is
the bias token-level IS has for sequence-level rewards (the Liu & Li analysis): the
weights are near 1 where the engines agree, which the step's `mismatch` metrics show.

Neither mode bounds w from below (a token the trainer finds less likely than the
rollout did is weighed down, not dropped), as verl's truncate mode and TRL. A weight
that is not finite (a rollout log-prob of -inf, an overflow) is 0 in both modes: such a
token carries no usable correction. Dropped tokens stay in the token-mean's denominator
(the batch's loss tokens), as decoupled PPO's here; verl removes them from it.

rollout_correction none with behav_logprobs (max_staleness > 0) is decoupled PPO's
handling, mis at behav_weight_cap (AReaL), bit for bit what it was; without behav_logprobs
there is no weight at all.
"""
from __future__ import annotations

import torch


def rollout_weights(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mode: str, cap: float
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: the importance weight `mode` (tis, mis) gives, and whether the cap
    acted on it (tis: truncated; mis: dropped; either: a weight that is not finite)."""
    weight = torch.exp(old_logprobs - rollout_logprobs).detach()
    finite = torch.isfinite(weight)
    capped = (weight > cap) | ~finite
    zero = torch.zeros_like(weight)
    if mode == "tis":
        return torch.where(finite, torch.clamp(weight, max=cap), zero), capped
    if mode == "mis":
        # zero the weight itself (not the product): 0 * inf in the backward pass would be NaN
        return torch.where(capped, zero, weight), capped
    raise ValueError(f"rollout correction mode must be tis or mis, got {mode!r}")


def correct(pg: torch.Tensor, is_clipped: torch.Tensor, old_logprobs: torch.Tensor,
            rollout_logprobs: torch.Tensor | None, correction: str, cap: float, behav_weight_cap: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An objective's per-token policy term `pg` (and where its clip acted) weighed by the
    rollout's log-probs, `correction` (none: decoupled PPO's mis at behav_weight_cap);
    also where the cap acted. Without rollout log-probs, `pg` as it is and no cap."""
    if rollout_logprobs is None:
        return pg, is_clipped, torch.zeros_like(is_clipped, dtype=torch.bool)
    mode, bound = ("mis", behav_weight_cap) if correction == "none" else (correction, cap)
    weight, capped = rollout_weights(old_logprobs, rollout_logprobs, mode, bound)
    kept = ~capped if mode == "mis" else torch.ones_like(capped)
    return pg * weight, is_clipped & kept, capped
