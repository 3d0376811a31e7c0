"""The advantages of each RL objective (algorithm.name), from the samples' rewards.

numpy, no torch: the controller's reward stages (streaming, agentic) and the trainer
(a batch of rewards) compute the same numbers. Each objective's loss side is in
trainer/native/objectives.py. Sources, per objective:

    grpo          (r - mean_g) / (std_g + eps)       Shao et al. 2024, DeepSeekMath, arXiv 2402.03300
    gspo, cispo   as grpo                            arXiv 2507.18071; arXiv 2506.13585
    dr_grpo       r - mean_g                         Liu et al. 2025, arXiv 2503.20783 (`dr_grpo_advantages`)
    dapo          grpo's, of the reward + the        Yu et al. 2025, arXiv 2503.14476
                  overlong penalty                   (`overlong_penalty`)
    rloo          r_i - mean_{j != i} r_j            Ahmadian et al. 2024, arXiv 2402.14740 (`rloo_advantages`)
    reinforce_pp  per token, KL-shaped returns,      Hu 2025, REINFORCE++, arXiv 2501.03262
                  whitened over the whole batch      (`reinforce_pp_returns`, `whiten`)
    opd           per token, teacher - student       on-policy distillation: Agarwal et al. 2024,
                  log-prob (no reward)               GKD, arXiv 2306.13649; Thinking Machines 2025
                                                     (`opd_advantages`)

Group-wise objectives see only one group, so a data-parallel rank's part (whole
groups: TrainBatch.shard) gets the advantages of the whole batch. REINFORCE++'s
whitening takes statistics of the whole batch: `batch_advantages` sums them with the
`reduce` it is given (the trainer's all-reduce over its ranks).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from dynarl.components.experience import group_advantages
from dynarl.components.trainer.base import OBJECTIVES, TrainBatch, TrainerConfig

WHOLE_BATCH = ("dr_grpo", "gspo", "reinforce_pp")
"""Objectives whose step needs the whole batch at once: dr_grpo's and gspo's loss divide
by the batch's sample count, reinforce_pp's advantages by its token statistics. A
streaming trainer (parts one by one) cannot take them."""

Reduce = Callable[[np.ndarray], np.ndarray]
"""Sums a float64 vector over the trainer's data-parallel ranks (identity on one)."""


def _rewards(rewards: Sequence[float]) -> np.ndarray:
    return np.asarray(rewards, dtype=np.float32).astype(np.float64)  # a batch's rewards are float32


def _all_equal(r: np.ndarray) -> bool:
    """A group with nothing to compare (one sample, or equal rewards) gets advantage 0
    exactly: the mean of equal floats can be off by an ulp."""
    return r.size < 2 or bool((r == r[0]).all())


def dr_grpo_advantages(rewards: Sequence[float]) -> list[float]:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective", arXiv 2503.20783): GRPO's advantage without the division by
    the group's std (which weighs too easy and too hard questions up):

        A_i = r_i - mean_j r_j            j over the sample's group

    A group of one, or of equal rewards, gets 0."""
    r = _rewards(rewards)
    if _all_equal(r):
        return [0.0] * int(r.size)
    return (r - r.mean()).astype(np.float32).tolist()


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    """RLOO (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", arXiv 2402.14740):
    each sample's baseline is the mean reward of the others of its group (k samples):

        A_i = r_i - 1/(k - 1) * sum_{j != i} r_j

    A group of one (no other sample) or of equal rewards gets 0."""
    r = _rewards(rewards)
    if _all_equal(r):
        return [0.0] * int(r.size)
    others = (r.sum() - r) / (r.size - 1)
    return (r - others).astype(np.float32).tolist()


def overlong_penalty(length: int, max_len: int, buffer: int, factor: float = 1.0) -> float:
    """DAPO's "soft overlong punishment" (Yu et al. 2025, arXiv 2503.14476), added to
    the reward of a response of `length` tokens, L_max = max_len, L_cache = buffer:

        0                                      |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache    L_max - L_cache < |y| <= L_max
        -1                                     L_max < |y|

    times `factor` (1 in the paper). buffer 0: no penalty."""
    if buffer <= 0:
        return 0.0
    expected = max_len - buffer
    if length <= expected:
        return 0.0
    if length <= max_len:
        return factor * (expected - length) / buffer
    return -factor


def group_advantages_for(config: TrainerConfig, rewards: Sequence[float], lengths: Sequence[int]) -> list[float]:
    """One group's per-sample advantages under `config.objective` (`lengths`: the
    responses' token counts, for dapo's penalty). reinforce_pp's need the whole batch
    (`batch_advantages`): a group alone gets zeros (the config keeps reinforce_pp off
    the paths that would train on them: trainer.streaming)."""
    name = config.objective
    if name in ("grpo", "gspo", "cispo"):
        return group_advantages(rewards, config.adv_eps)
    if name == "dapo":
        shaped = [float(np.float32(r)) + overlong_penalty(n, config.max_response_len, config.overlong_buffer,
                                                         config.overlong_penalty)
                  for r, n in zip(rewards, lengths)]
        return group_advantages(shaped, config.adv_eps)
    if name == "dr_grpo":
        return dr_grpo_advantages(rewards)
    if name == "rloo":
        return rloo_advantages(rewards)
    if name in ("reinforce_pp", "opd"):
        return [0.0] * len(rewards)  # (opd's come from the teacher, not the rewards)
    raise ValueError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")


def reinforce_pp_returns(rewards: Sequence[float], old_logprobs: Sequence[Sequence[float]] | None,
                         ref_logprobs: Sequence[Sequence[float]] | None, masks: Sequence[Sequence[int]],
                         beta: float) -> list[list[float]]:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): the reward comes at the last
    token, a KL penalty at every token, and the return (gamma = 1) is

        KL_t = log pi_old(y_t) - log pi_ref(y_t)           (k1, the sampling policy's)
        A_t  = r - beta * sum_{s >= t} KL_s                 s over the loss tokens

    per response token; tokens with mask 0 (tool observations) are not actions: they
    add no KL and get 0 (they are not in the loss). beta = trainer.engine.kl_coef (0:
    A_t = r). Whitened over the batch next (`whiten`)."""
    out = []
    for i, (reward, mask) in enumerate(zip(rewards, masks)):
        r = float(np.float32(reward))
        kl = [0.0] * len(mask)
        if beta > 0:
            if old_logprobs is None or ref_logprobs is None:
                raise ValueError("reinforce_pp with kl_coef > 0 needs old_logprobs and ref_logprobs")
            kl = [(old - ref) if m else 0.0 for old, ref, m in zip(old_logprobs[i], ref_logprobs[i], mask)]
        tail = np.cumsum(np.asarray(kl[::-1], dtype=np.float64))[::-1]  # sum_{s >= t} KL_s
        out.append([r - beta * float(tail[t]) if m else 0.0 for t, m in enumerate(mask)])
    return out


def opd_advantages(old_logprobs: Sequence[Sequence[float]], teacher_logprobs: Sequence[Sequence[float]],
                   masks: Sequence[Sequence[int]]) -> list[list[float]]:
    """On-policy distillation's per-token advantage: the negative of the per-token
    reverse KL from the student to the teacher, on the student's own samples

        A_t = -(log pi_student(y_t) - log pi_teacher(y_t)) = log pi_teacher(y_t) - log pi_old(y_t)

    with discount 0 (each token its own; no sum over the tokens after it) and no reward.
    The policy gradient with these advantages, at ratio 1, is -sum_t A_t grad log pi(y_t):
    a single-sample estimate of the gradient of KL(pi || pi_teacher), the reverse KL, which
    is mode-seeking (Agarwal et al. 2024, "On-Policy Distillation of Language Models:
    Learning from Self-Generated Mistakes" (GKD), arXiv 2306.13649, with divergence reverse
    KL and student-generated data; Thinking Machines, "On-Policy Distillation", 2025, and
    tinker-cookbook's distillation/train_on_policy.py incorporate_kl_penalty, which takes
    kl_penalty_coef 1 and kl_discount_factor 0 by default). The student's log-probs are
    old_logprobs, the trainer's own weights (tinker-cookbook takes the sampler's; the
    rollout engine's gap to them is the step's `mismatch`). Tokens with mask 0 (tool
    observations) get 0."""
    out = []
    for old, teacher, mask in zip(old_logprobs, teacher_logprobs, masks, strict=True):
        if not len(old) == len(teacher) == len(mask):
            raise ValueError(f"old ({len(old)}) and teacher ({len(teacher)}) log-probs and mask ({len(mask)}) "
                             "must cover the same tokens")
        out.append([float(np.float32(t - o)) if m else 0.0 for o, t, m in zip(old, teacher, mask)])
    return out


def opd_batch_advantages(batch: TrainBatch) -> list[list[float]]:
    """`opd_advantages` of a batch: its old and teacher log-probs and loss masks."""
    if batch.teacher_logprobs is None or batch.old_logprobs is None:
        raise ValueError("objective opd needs the batch's teacher_logprobs and old_logprobs (algorithm.teacher)")
    return opd_advantages(batch.old_logprobs, batch.teacher_logprobs, response_masks(batch))


def whiten(values: Sequence[Sequence[float]], masks: Sequence[Sequence[int]], eps: float,
           reduce: Reduce | None = None) -> list[list[float]]:
    """REINFORCE++'s global normalisation (arXiv 2501.03262, "advantage
    normalization"): over every loss token of the batch (all ranks: `reduce` sums),

        A'_t = (A_t - mean) / (std + eps)       std: the population standard deviation

    Tokens with mask 0 stay 0. A batch whose tokens all have one value gets 0."""
    reduce = reduce or (lambda a: a)
    flat = np.asarray([v for row, mask in zip(values, masks) for v, m in zip(row, mask) if m], dtype=np.float64)
    total, count = reduce(np.asarray([flat.sum(), float(flat.size)], dtype=np.float64))
    if count == 0:
        return [[0.0] * len(row) for row in values]
    mean = total / count
    # (the same ops on every rank: each rank's values are shifted by the one global mean)
    (square,) = reduce(np.asarray([((flat - mean) ** 2).sum()], dtype=np.float64))
    std = float(np.sqrt(square / count))
    if std == 0:
        return [[0.0] * len(row) for row in values]
    return [[float(np.float32((v - mean) / (std + eps))) if m else 0.0 for v, m in zip(row, mask)]
            for row, mask in zip(values, masks)]


def response_lengths(batch: TrainBatch) -> list[int]:
    return [len(ids) - p for ids, p in zip(batch.input_ids, batch.prompt_lens)]


def response_masks(batch: TrainBatch) -> list[list[int]]:
    if batch.response_mask is not None:
        return [[1 if m else 0 for m in row] for row in batch.response_mask]
    return [[1] * n for n in response_lengths(batch)]


def loss_samples(batch: TrainBatch) -> int:
    """Samples with at least one loss token: the B of dr_grpo's and gspo's per-sample mean."""
    return sum(1 for row in response_masks(batch) if any(row))


def batch_advantages(config: TrainerConfig, batch: TrainBatch, reduce: Reduce | None = None) -> list:
    """The advantages of a batch of rewards under `config.objective` (not grpo's:
    trainer/native/losses.py step_advantages keeps those): per sample, group by group
    (`group_advantages_for`), or per response token (reinforce_pp, whitened over every
    rank's tokens by `reduce`)."""
    if config.objective == "opd":
        return opd_batch_advantages(batch)
    assert batch.rewards is not None and batch.group_ids is not None  # (TrainBatch checks rewards have groups)
    if config.objective == "reinforce_pp":
        masks = response_masks(batch)
        returns = reinforce_pp_returns(batch.rewards, batch.old_logprobs, batch.ref_logprobs, masks,
                                       config.kl_coef)
        return whiten(returns, masks, config.adv_eps, reduce)
    lengths = response_lengths(batch)
    out: list[float] = [0.0] * len(batch)
    for g in dict.fromkeys(batch.group_ids):
        rows = [i for i, gid in enumerate(batch.group_ids) if gid == g]
        values = group_advantages_for(config, [batch.rewards[i] for i in rows], [lengths[i] for i in rows])
        for i, a in zip(rows, values):
            out[i] = a
    return out
