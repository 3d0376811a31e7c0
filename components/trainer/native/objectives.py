"""The loss of each RL objective (algorithm.name, TrainerConfig.objective), as pure torch
functions, and the two entry points the native trainer calls: `step_advantages` (what a
step weighs its tokens by) and `micro_batch_loss` (one micro-batch's terms).

grpo is losses.py's, untouched (bit for bit what it was). Every objective reports the
same terms (losses.GRPOLoss): `pg_loss` is the objective's policy term as aggregated
below; the k3 KL to the reference policy, the entropy bonus and clip_frac are token-means
over the batch as in grpo (reinforce_pp: the KL is in its advantages, the k3 term is
reported only). dr_grpo weighs its KL and entropy terms in the loss as its policy term,
token sum / (B * L): as token-means beside a policy term that much smaller, the entropy
bonus (trainer.engine.entropy_coef 0.02) outweighed it and the main job collapsed at
steps 40-60 (docs/benchmarks.md). Advantages: trainer/advantages.py.

    objective     policy term per token                      aggregation over the batch
    grpo, dapo,   PPO-clip (losses.policy_gradient_loss)     token-mean
    rloo,
    reinforce_pp,
    opd
    dr_grpo       PPO-clip                                   token sum / (B * L)
    gspo          sequence ratio, clipped per sequence       mean over the B sequences
    cispo         -sg(clip(ratio)) * A * logprob            token-mean

B: the global batch's samples with a loss token; L: max_response_len (rollout.max_new_tokens).
opd's advantages are per token, teacher - old log-prob (advantages.py opd_advantages):
its loss is grpo's.

Every objective's per-token policy term is then weighed by the rollout's log-probs when
the batch has them (behav_logprobs: rollout_correction.py `correct`): tis or mis
(rollout_correction), or decoupled PPO's cap (none, with max_staleness > 0);
`rollout_capped_frac` reports the tokens whose weight the cap truncated or dropped.

Where this departs from a paper: rloo and reinforce_pp put their advantages into grpo's
PPO-clip token-mean surrogate (as verl and OpenRLHF do); the RLOO paper optimises plain
REINFORCE with one action per completion, which on-policy (ratio 1) is the same gradient
per token but weighs samples by their token count differently. DAPO and CISPO drop the KL
term: leave trainer.engine.kl_coef at 0 for them. Streaming (trainer.streaming) cannot
take dr_grpo, gspo or reinforce_pp (advantages.WHOLE_BATCH); gspo and cispo take no
stale behaviour policy (algorithm.max_staleness 0), only a rollout correction's.
"""
from __future__ import annotations

import torch

from dynarl.components.trainer import advantages as adv
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native import losses
from dynarl.components.trainer.native.losses import GRPOLoss, kl_k3, policy_gradient_loss, token_mean
from dynarl.components.trainer.native.rollout_correction import correct

PPO_TOKEN_MEAN = ("grpo", "dapo", "rloo", "opd")
"""Objectives whose loss is grpo's (losses.micro_batch_loss); only their advantages (and
dapo's clip range) differ."""


def gspo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     mask: torch.Tensor, sample_index: torch.Tensor, clip_eps_low: float, clip_eps_high: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv 2507.18071):
    one importance ratio per sequence, the geometric mean of its tokens', clipped at the
    sequence level:

        s_i    = exp( 1/|y_i| * sum_t (logprob_it - old_logprob_it) )
        loss_i = -min(s_i * A_i, clip(s_i, 1 - eps_low, 1 + eps_high) * A_i)

    (eps 3e-4 / 4e-4 in the paper: the sequence ratio stays close to 1). Tokens are
    sample after sample, `sample_index` giving each one's sequence (0..n-1); |y_i| counts
    its tokens with mask 1 (the others take no part in the ratio) and A_i is its advantage
    (one per sequence: its first token's). Returns per-token values loss_i / |y_i| (the sum
    over a sequence's mask 1 tokens is loss_i) and, per token, whether its sequence's clip
    was active."""
    n = int(sample_index.max()) + 1 if sample_index.numel() else 0
    mask = mask.to(logprobs.dtype)
    count = torch.zeros(n, dtype=logprobs.dtype, device=logprobs.device).index_add(0, sample_index, mask)
    log_ratio = torch.zeros(n, dtype=logprobs.dtype, device=logprobs.device).index_add(
        0, sample_index, torch.where(mask > 0, logprobs - old_logprobs, torch.zeros_like(logprobs)))
    seq_ratio = torch.exp(log_ratio / count.clamp(min=1))
    first = torch.ones_like(sample_index, dtype=torch.bool)
    first[1:] = sample_index[1:] != sample_index[:-1]
    seq_adv = torch.zeros(n, dtype=advantages.dtype, device=advantages.device)
    seq_adv[sample_index[first]] = advantages[first]
    unclipped = seq_ratio * seq_adv
    clipped = torch.clamp(seq_ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * seq_adv
    seq_loss = -torch.minimum(unclipped, clipped)
    is_clipped = (clipped < unclipped).detach()
    return (seq_loss / count.clamp(min=1))[sample_index], is_clipped[sample_index]


def cispo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                      clip_eps_low: float, clip_eps_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with
    Lightning Attention", arXiv 2506.13585): REINFORCE weighted by the clipped
    importance weight, which carries no gradient, so no token's gradient is dropped:

        ratio  = exp(logprob - old_logprob)
        loss_t = -sg(clip(ratio, 1 - eps_low, 1 + eps_high)) * A * logprob
        d loss_t / d logprob = -clip(ratio, 1 - eps_low, 1 + eps_high) * A

    The paper sets no lower bound (eps_low 1: the weight is never below 0) and tunes
    eps_high. Returns per-token losses and where the weight was clipped."""
    ratio = torch.exp(logprobs - old_logprobs).detach()
    weight = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high)
    is_clipped = (ratio < 1.0 - clip_eps_low) | (ratio > 1.0 + clip_eps_high)
    return -weight * advantages * logprobs, is_clipped


def _terms(pg_loss: torch.Tensor, is_clipped: torch.Tensor, capped: torch.Tensor, logprobs: torch.Tensor,
           mask: torch.Tensor, ref_logprobs: torch.Tensor | None, kl_coef: float, entropy: torch.Tensor | None,
           entropy_coef: float, num_tokens: float, penalty_scale: float = 1.0) -> GRPOLoss:
    """A policy term with grpo's others: k3 KL, entropy, clip_frac and rollout_capped_frac
    as token-means; the KL and entropy terms weigh `penalty_scale` times their token-mean
    in the loss (dr_grpo: their token sum / (B * L), as its policy term)."""
    zero = pg_loss.new_zeros(())
    kl = token_mean(kl_k3(logprobs, ref_logprobs), mask, num_tokens) if ref_logprobs is not None else zero
    ent = token_mean(entropy, mask, num_tokens) if entropy is not None else zero
    loss = pg_loss + penalty_scale * (kl_coef * kl - entropy_coef * ent)
    return GRPOLoss(loss, pg_loss, kl, ent, token_mean(is_clipped.to(pg_loss.dtype), mask, num_tokens),
                    token_mean(capped.to(pg_loss.dtype), mask, num_tokens))


def objective_loss(objective: str, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                   mask: torch.Tensor, *, clip_eps_low: float, clip_eps_high: float, num_tokens: float,
                   num_samples: int = 0, max_response_len: int = 0, sample_index: torch.Tensor | None = None,
                   ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
                   entropy: torch.Tensor | None = None, entropy_coef: float = 0.0,
                   behav_logprobs: torch.Tensor | None = None, behav_weight_cap: float = 5.0,
                   rollout_correction: str = "none", rollout_correction_cap: float = 2.0) -> GRPOLoss:
    """The terms of `objective` over these tokens, each term's share of the batch's:
    `num_tokens` is the batch's loss tokens, `num_samples` its samples with a loss token
    (B: dr_grpo, gspo). grpo, dapo, rloo and opd give losses.grpo_loss's terms. Given
    the rollout's log-probs (`behav_logprobs`), each token's policy term is weighed by
    them (rollout_correction.py `correct`)."""
    if objective in ("dr_grpo", "gspo") and num_samples < 1:
        raise ValueError(f"{objective} divides by the batch's samples: num_samples must be >= 1")

    def corrected(pg: torch.Tensor, is_clipped: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return correct(pg, is_clipped, old_logprobs, behav_logprobs, rollout_correction, rollout_correction_cap,
                       behav_weight_cap)

    if objective in ("grpo", "dapo", "rloo", "opd", "dr_grpo", "reinforce_pp"):
        pg, is_clipped, capped = corrected(*policy_gradient_loss(logprobs, old_logprobs, advantages, clip_eps_low,
                                                                 clip_eps_high))
        scale = 1.0
        if objective == "dr_grpo":  # Dr. GRPO: sum over tokens / (B * L), no per-sequence length
            pg_loss = (pg * mask).sum() / (num_samples * max_response_len)
            scale = num_tokens / (num_samples * max_response_len)  # its KL and entropy bonus alike
        else:
            pg_loss = token_mean(pg, mask, num_tokens)
        if objective == "reinforce_pp":
            kl_coef = 0.0  # (REINFORCE++: the KL penalty is in the advantages)
        return _terms(pg_loss, is_clipped, capped, logprobs, mask, ref_logprobs, kl_coef, entropy, entropy_coef,
                      num_tokens, penalty_scale=scale)
    if behav_logprobs is not None and rollout_correction == "none":
        raise ValueError(f"{objective} weighs tokens against the policy that sampled them: it takes no "
                         "behav_logprobs (algorithm.max_staleness 0) but a rollout correction's")
    if objective == "gspo":
        if sample_index is None:
            raise ValueError("gspo needs each token's sample (sample_index)")
        pg, is_clipped, capped = corrected(*gspo_policy_loss(logprobs, old_logprobs, advantages, mask, sample_index,
                                                             clip_eps_low, clip_eps_high))
        pg_loss = (pg * mask).sum() / num_samples
    elif objective == "cispo":
        pg, is_clipped, capped = corrected(*cispo_policy_loss(logprobs, old_logprobs, advantages, clip_eps_low,
                                                              clip_eps_high))
        pg_loss = token_mean(pg, mask, num_tokens)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    return _terms(pg_loss, is_clipped, capped, logprobs, mask, ref_logprobs, kl_coef, entropy, entropy_coef,
                  num_tokens)


def micro_batch_loss(logprobs, entropy, mb, config: TrainerConfig, num_tokens: int, num_samples: int = 0):
    """The terms of one micro-batch under config.objective (on-policy when it has no old
    log-probs): grpo, dapo, rloo and opd take losses.micro_batch_loss as it is."""
    if config.objective in PPO_TOKEN_MEAN:
        return losses.micro_batch_loss(logprobs, entropy, mb, config, num_tokens)
    old = mb.old_logprobs if mb.old_logprobs is not None else logprobs.detach()
    return objective_loss(config.objective, logprobs, old, mb.advantages, torch.ones_like(logprobs),
                          clip_eps_low=config.clip_eps_low, clip_eps_high=config.clip_eps_high,
                          num_tokens=num_tokens, num_samples=num_samples,
                          max_response_len=config.max_response_len, sample_index=mb.sample_index,
                          ref_logprobs=mb.ref_logprobs, kl_coef=config.kl_coef, entropy=entropy,
                          entropy_coef=config.entropy_coef, behav_logprobs=mb.behav_logprobs,
                          behav_weight_cap=config.behav_weight_cap, rollout_correction=config.rollout_correction,
                          rollout_correction_cap=config.rollout_correction_cap)


def step_advantages(batch: TrainBatch, config: TrainerConfig, reduce: adv.Reduce | None = None) -> list:
    """What a step trains on: the batch's own advantages, or its rewards' under
    config.objective (grpo: losses.step_advantages; reinforce_pp whitens over every rank's
    tokens with `reduce`); opd's, always from its teacher's log-probs (a streaming part's
    advantages are the reward stage's, which opd does not read). Refuses a KL term
    without reference log-probs."""
    if config.objective == "opd":
        if config.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs batch.ref_logprobs")
        return adv.opd_batch_advantages(batch)
    if config.objective == "grpo" or batch.advantages is not None:
        return losses.step_advantages(batch, config)
    if config.kl_coef > 0 and batch.ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs batch.ref_logprobs")
    return adv.batch_advantages(config, batch, reduce)
