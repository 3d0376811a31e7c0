"""How far apart two policies' log-probs of the same sampled tokens are: the rollout
engine's and the trainer's (the log-prob mismatch), or the student's and a teacher's
(on-policy distillation's reverse KL).

Each Sample carries `logprobs`, the rollout engine's log-prob of every token it
generated, and after the inference stage `old_logprobs`, the same tokens scored by a
full forward with the trainer's weights (and, for algorithm.name opd, `teacher_logprobs`).
Both engines hold the same weights, so on-policy the gap is numerics alone (kernels,
dtype, batching); with max_staleness > 0 or partial rollout it also holds the policy
lag. The inference worker, which has every pair at hand, sums the gap over the loss
tokens (mask 1: not tool observations) of each chunk; ranks' sums add (`merge`), and
the step's metrics are their ratios (`mismatch_metrics`, `teacher_metrics`).

With p the sampling policy and q the other one, both scoring tokens y_t ~ p, and
d_t = log q(y_t) - log p(y_t):

    mean d              mean over tokens of d_t (mismatch: old - rollout)
    mean |d|, max |d|   the size of the gap
    KL(p || q), k1      -mean d per token; per sequence -sum_t d_t, averaged over sequences
                        (an unbiased estimate of the sequence KL, which may come out < 0)
    KL(p || q), k3      mean of exp(d) - d - 1 (Schulman's k3: >= 0, unbiased per token)

verl's rollout-correction metrics (docs/algo/rollout_corr_math.md, section 4.1:
`mismatch_kl` and `mismatch_k3_kl`) are the same two estimators, of KL(rollout || old).
A token whose d is not finite (a log-prob of -inf; or d > MAX_GAP) is counted apart (`nonfinite`)
and left out of the sums, so one such token does not turn the step's figures to inf.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Sequence

from dynarl.transport.wire import register_struct

MAX_GAP = 700.0
"""A d above this counts as not finite: exp(d) is past float64's range near 709."""


@register_struct(90)
@dataclass(frozen=True, slots=True, kw_only=True)
class LogprobGap:
    """Sums over the loss tokens of some samples of d = log q - log p (module docstring)."""
    tokens: int = 0
    """Loss tokens with a finite d."""
    sequences: int = 0
    """Samples with at least one such token."""
    diff_sum: float = 0.0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    k3_sum: float = 0.0
    nonfinite: int = 0
    """Loss tokens whose d is not finite (left out of the sums)."""

    @classmethod
    def merge(cls, parts: Sequence["LogprobGap | None"]) -> "LogprobGap":
        """The gap over every part's tokens (None parts: none)."""
        given = [p for p in parts if p is not None]
        sums = {f.name: sum(getattr(p, f.name) for p in given) for f in fields(cls) if f.name != "abs_max"}
        return cls(**sums, abs_max=max((p.abs_max for p in given), default=0.0))


def logprob_gap(sampler: Sequence[float], other: Sequence[float], mask: Sequence[int] | None = None) -> LogprobGap:
    """The gap of one sample: `sampler` the log-probs of the policy that drew its tokens
    (p), `other` another policy's of the same tokens (q), `mask` 1 on loss tokens (None:
    all). Refuses lists of different lengths: they would not be the same tokens."""
    if len(sampler) != len(other) or (mask is not None and len(mask) != len(sampler)):
        raise ValueError(f"log-probs of {len(sampler)} and {len(other)} tokens"
                         + ("" if mask is None else f" with a mask of {len(mask)}") + ": not the same tokens")
    n = nonfinite = 0
    diff = absolute = largest = k3 = 0.0
    for i, (p, q) in enumerate(zip(sampler, other)):
        if mask is not None and not mask[i]:
            continue
        d = float(q) - float(p)
        if not math.isfinite(d) or d > MAX_GAP:  # (exp(d) of k3 would overflow)
            nonfinite += 1
            continue
        n += 1
        diff += d
        absolute += abs(d)
        largest = max(largest, abs(d))
        k3 += math.expm1(d) - d
    return LogprobGap(tokens=n, sequences=1 if n else 0, diff_sum=diff, abs_sum=absolute, abs_max=largest,
                      k3_sum=k3, nonfinite=nonfinite)


def _ratios(gap: LogprobGap) -> dict[str, float]:
    n = gap.tokens
    return {"kl": -gap.diff_sum / n, "kl_seq": -gap.diff_sum / gap.sequences, "k3": gap.k3_sum / n}


def mismatch_metrics(gap: LogprobGap | None, backend: str) -> dict[str, Any]:
    """The step's `mismatch` metrics: the rollout engine (p, tagged `backend`) against
    the trainer's weights (q: old_logprobs); {} when nothing was measured."""
    if gap is None or gap.tokens == 0:
        return {}
    n = gap.tokens
    return {"mismatch": {"backend": backend, "tokens": n, "nonfinite": gap.nonfinite,
                         "abs_mean": gap.abs_sum / n, "abs_max": gap.abs_max, "mean": gap.diff_sum / n,
                         **_ratios(gap)}}


def teacher_metrics(gap: LogprobGap | None) -> dict[str, Any]:
    """The step's `teacher` metrics (algorithm.name opd): the student (p: old_logprobs)
    against the teacher (q): `kl` is the reverse KL KL(student || teacher) per token, the
    mean of -A_t (the negative of opd's advantage); {} when there is no teacher."""
    if gap is None or gap.tokens == 0:
        return {}
    return {"teacher": {"tokens": gap.tokens, "nonfinite": gap.nonfinite, "abs_mean": gap.abs_sum / gap.tokens,
                        **_ratios(gap)}}
