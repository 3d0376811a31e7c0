"""RLinf's re-plan trigger: a stage whose measured time drifts from the profile.

RLinf re-profiles and re-plans when a component's measured execution time moves
more than a threshold (15% by default) away from what the plan assumed.
"""
from __future__ import annotations

from typing import Mapping

DEFAULT_THRESHOLD = 0.15


def drifted(predicted: Mapping[str, float], measured: Mapping[str, float],
            threshold: float = DEFAULT_THRESHOLD) -> list[str]:
    """Components measured more than `threshold` (relative) away from their prediction,
    in sorted order; components missing on either side are not judged."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    out = []
    for c in sorted(set(predicted) & set(measured)):
        p, m = predicted[c], measured[c]
        if p <= 0:
            if m > 0:
                out.append(c)
        elif abs(m - p) / p > threshold:
            out.append(c)
    return out
