"""One line of metrics.jsonl per step: rewards, lengths, throughput, stage times; the
rollout engine's log-prob gap to the trainer's weights (`mismatch`, tagged with the
rollout backend) and a teacher's to the student's (`teacher`, opd): inference/gap.py."""
from __future__ import annotations

import time
from typing import Any, Sequence

from dynarl.components.experience import Trained
from dynarl.components.inference.gap import LogprobGap, mismatch_metrics, teacher_metrics
from dynarl.components.stage_results import InferenceStats, RewardStats, RolloutStats
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.core.scheduler.log import DeviceCounts, device_stats

STAGES = ("rollout", "reward", "inference", "trainer", "sync")


def step_metrics(step: int, trained: Trained, train: TrainMetrics, rollout_stats: Sequence[RolloutStats],
                 reward_stats: Sequence[RewardStats], stage_s: dict[str, float], step_time_s: float, *,
                 with_kl: bool = True, inference_stats: Sequence[InferenceStats] = (),
                 rollout_backend: str = "") -> dict[str, Any]:
    """`step`: the step's index, from 0 (as in ledger.jsonl and the console's `step 0 (1/N)`);
    `with_kl`: the loss has a KL term (kl_coef > 0); without one "kl" is null, not 0."""
    rewards = trained.rewards
    lengths = sorted(trained.lengths)
    tokens = sum(r.tokens for r in rollout_stats)
    n = len(rewards)
    mean = sum(rewards) / n
    return {
        "step": step,
        "reward_mean": mean,
        "reward_std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
        "exact_frac": sum(r == 1.0 for r in rewards) / n,
        "response_len_mean": sum(lengths) / n,
        "response_len_p50": lengths[n // 2],
        "response_len_p90": lengths[min(n - 1, int(0.9 * n))],
        "response_len_max": lengths[-1],
        "truncated_frac": sum(f == "length" for f in trained.finishes) / n,
        "samples": n,
        "tokens": tokens,
        "moved_reprefill_tokens": sum(r.reprefill_tokens for r in rollout_stats),
        "tokens_per_s": tokens / step_time_s,
        "step_time_s": step_time_s,
        **{f"{name}_s": stage_s.get(name, 0.0) for name in STAGES},
        "weight_version": min(trained.versions),
        # how many versions older than the trainer's (`step`) each sample's generating weights were
        "staleness_max": max(step - v for v in trained.versions),
        "staleness_mean": sum(step - v for v in trained.versions) / n,
        "loss": train.loss, "entropy": train.entropy, "grad_norm": train.grad_norm,
        "kl": train.kl if with_kl else None, "clip_frac": train.clip_frac,
        "rollout_capped_frac": train.rollout_capped_frac,
        "verifier": reward_stats[0].verifier,
        **function_metrics(reward_stats),
        "time": time.time(),
        **mismatch_metrics(LogprobGap.merge([s.rollout_gap for s in inference_stats]), rollout_backend),
        **teacher_metrics(LogprobGap.merge([s.teacher_gap for s in inference_stats])),
    }


def function_metrics(reward_stats: Sequence[RewardStats]) -> dict[str, Any]:
    """reward.function's step (none for a verifier): the samples whose call failed,
    the first failure's message (None: none), each named score's mean over the samples
    that returned it."""
    if not reward_stats or reward_stats[0].verifier != "function":
        return {}
    totals: dict[str, list[float]] = {}
    for r in reward_stats:
        for name, (total, count) in r.scores.items():
            both = totals.setdefault(name, [0.0, 0])
            both[0] += total
            both[1] += count
    return {"reward_errors": sum(r.errors for r in reward_stats),
            "reward_timeouts": sum(r.timeouts for r in reward_stats),
            "reward_first_error": next((r.first_error for r in reward_stats if r.first_error), None),
            "reward_scores": {name: total / count for name, (total, count) in sorted(totals.items()) if count}}


def fixed_devices(groups: Any) -> dict[str, Any]:
    """A step's device counts where nothing moves (scheduler.policy=static): the
    `devices` series a dynarl step reports for the components it moves (dynamic.py),
    constant."""
    counts = {"rollout": len(groups.rollout.devices), "trainer": len(groups.trainer.devices)}
    return {"devices": device_stats([DeviceCounts(0.0, counts)], 0.0, 0.0)}
