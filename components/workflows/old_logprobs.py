"""Where a step's old log-probs come from (inference.old_logprobs). PPO-clip's ratio is
pi_theta / pi_old. On a step that generates its batch with the trainer's current
weights and trains it with one optimizer step (workflow grpo, fresh batches), pi_old is
the trainer's own policy at that step: its forward's log-probs, detached, give the
ratio's denominator (exactly 1 at the step), and the inference pass that recomputes
them is work for nothing (TRL's GRPOTrainer skips it the same way at
num_iterations 1). Elsewhere the pass stays: `needs_inference` says why."""
from __future__ import annotations

from typing import Any


def needs_inference(cfg: Any) -> str | None:
    """Why the step runs the inference pass (old log-probs, and what else it gives);
    None: inference.old_logprobs auto and the trainer's forward gives them. Pure: a
    TrainConfig in, a reason out."""
    if cfg.inference.old_logprobs == "always":
        return "inference.old_logprobs is always"
    if cfg.workflow != "grpo":
        return f"workflow {cfg.workflow}"
    if cfg.algorithm.max_staleness > 0 or cfg.rollout.oversample > 1:
        return "off-policy steps (algorithm.max_staleness or rollout.oversample): an older policy made the samples"
    if cfg.with_ref:
        return "the KL term (trainer.engine.kl_coef > 0) needs the reference's log-probs"
    if cfg.algorithm.teacher is not None:
        return "opd: the teacher's log-probs"
    if cfg.algorithm.rollout_correction != "none":
        return "algorithm.rollout_correction weighs by the old over the rollout's log-probs"
    if cfg.trainer.streaming:
        return "trainer.streaming takes the samples one by one, as the inference stage splits the chunks"
    if cfg.scheduler.policy != "static":
        return "scheduler.policy dynarl plans with the inference stage"
    if cfg.rollout.backend != "native" or cfg.inference.backend != "native":
        return "an engine other than native: the rollout-trainer mismatch is measured there"
    if cfg.trainer.backend != "native":
        return f"trainer.backend {cfg.trainer.backend}"
    return None


def describe(cfg: Any) -> str:
    """Where the steps' old log-probs come from, in a line (`dynarl train --dry-run`)."""
    reason = needs_inference(cfg)
    if reason is None:
        return "old log-probs: the trainer's forward (on-policy, one update a batch): no inference stage or ranks"
    return f"old log-probs: the inference stage ({reason})"
