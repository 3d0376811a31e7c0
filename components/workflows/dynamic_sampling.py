"""DAPO's dynamic sampling, as pure decisions on scored groups.

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv
2503.14476, section 3.2: a group whose samples all got the same reward (accuracy 1 or 0
with a binary verifier) has advantage 0 everywhere under GRPO's normalisation, so it adds
no gradient and only dilutes the batch; DAPO over-samples and keeps only groups with

    0 < |{ o_i : is_equivalent(a, o_i) }| < G

i.e. rewards that are not all equal, until the batch is full.

Here (algorithm.dynamic_sampling, refill.py) the step starts its N groups as usual;
each group scored with equal rewards is dropped and, while the refill budget lasts,
replaced at once by the next prompt group of the stream, which the running rollout
takes up. So while the budget lasts, kept + in flight = N: the batch is exactly N
groups whose rewards differ; once it is spent, the step trains those it kept.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence


def informative(rewards: Sequence[float | None]) -> bool:
    """Whether a group's rewards differ (a group of one or none has nothing to compare)."""
    if any(r is None for r in rewards):
        raise ValueError("dynamic sampling needs scored groups: a sample has no reward")
    return len({float(r) for r in rewards}) > 1  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Tally:
    """One step's dynamic sampling so far."""
    need: int
    """Groups the batch wants (run.prompts_per_step)."""
    budget: int
    """Refills still allowed (algorithm.max_refills, less those made)."""
    outstanding: int
    """Groups generating or scoring, not yet decided."""
    kept: int = 0
    dropped: int = 0
    refilled: int = 0

    @property
    def refilling(self) -> bool:
        """More groups may still be sent to the rollout (its ENDs must wait)."""
        return self.budget > 0 and self.outstanding > 0

    @property
    def closed(self) -> bool:
        """Every group of the step is decided: the batch is `kept` groups."""
        return self.outstanding == 0


@dataclass(frozen=True, slots=True)
class Verdict:
    keep: bool
    """The group goes into the batch."""
    refill: bool
    """One more prompt group goes to the rollout in its place."""


def decide(tally: Tally, rewards: Sequence[float | None]) -> tuple[Tally, Verdict]:
    """Pure: a scored group's fate and the tally after it. Kept when its rewards differ
    and the batch has room; otherwise dropped, and refilled when the groups still in
    flight could no longer fill the batch and the budget allows."""
    if tally.outstanding < 1:
        raise ValueError("decide: no group of the step is outstanding")
    outstanding = tally.outstanding - 1
    if informative(rewards) and tally.kept < tally.need:
        return dataclasses.replace(tally, outstanding=outstanding, kept=tally.kept + 1), Verdict(True, False)
    refill = tally.budget > 0 and tally.kept + outstanding < tally.need
    after = dataclasses.replace(tally, outstanding=outstanding + refill, dropped=tally.dropped + 1,
                                budget=tally.budget - refill, refilled=tally.refilled + refill)
    return after, Verdict(False, refill)
