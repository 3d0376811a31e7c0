"""DAPO's dynamic sampling, as a pure decision on scored groups (the rollout side's: a
workflow that uses it generates more groups until the step has enough kept ones).

Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv
2503.14476: a group whose samples all got the same reward (accuracy 1 or 0 with a binary
verifier) has advantage 0 everywhere under GRPO's normalisation, so it adds no gradient
and only dilutes the batch; DAPO over-samples and keeps only groups with

    0 < |{ o_i : is_equivalent(a, o_i) }| < G

i.e. rewards that are not all equal. Not wired into the workflows yet.
"""
from __future__ import annotations

from typing import Sequence, TypeVar

G = TypeVar("G")


def keep_informative(groups: Sequence[G]) -> tuple[list[G], int]:
    """The groups whose rewards differ (in order) and how many were dropped. Each group
    has `.samples`, each with a `.reward` (experience.PromptGroup); a group of one sample
    has nothing to compare and is dropped, as is an empty one."""
    kept = []
    for group in groups:
        rewards = [s.reward for s in group.samples]  # type: ignore[attr-defined]
        if any(r is None for r in rewards):
            raise ValueError("keep_informative needs scored groups: a sample has no reward")
        if len({float(r) for r in rewards}) > 1:
            kept.append(group)
    return kept, len(groups) - len(kept)
