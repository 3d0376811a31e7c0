"""Profiled stage times: seconds for one iteration's batch at several device counts.

RLinf profiles each component at a few data-parallel sizes and extrapolates; here
the points are interpolated linearly in log-log space (a power law between two
neighbours: exact for linear scaling, close for rollout's flattening curve) and
extrapolated with the end segments' slopes, never letting more devices cost more.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StageProfile:
    points: tuple[tuple[int, float], ...]
    """(devices, seconds), at least one."""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a profile needs at least one point")
        ns = [n for n, _ in self.points]
        if len(set(ns)) != len(ns):
            raise ValueError(f"duplicate device counts in {self.points}")
        for n, t in self.points:
            if n < 1 or t <= 0:
                raise ValueError(f"profile point ({n}, {t}) needs devices >= 1 and seconds > 0")
        object.__setattr__(self, "points", tuple(sorted(self.points)))

    def time_at(self, devices: int) -> float:
        if devices < 1:
            raise ValueError(f"devices must be >= 1, got {devices}")
        pts = self.points
        if len(pts) == 1:  # one point: assume linear scaling
            n, t = pts[0]
            return t * n / devices
        if devices <= pts[0][0]:
            a, b = pts[0], pts[1]
        elif devices >= pts[-1][0]:
            a, b = pts[-2], pts[-1]
        else:
            i = next(i for i in range(1, len(pts)) if pts[i][0] >= devices)
            a, b = pts[i - 1], pts[i]
        slope = min(0.0, math.log(b[1] / a[1]) / math.log(b[0] / a[0]))
        return a[1] * math.exp(slope * math.log(devices / a[0]))

    def with_point(self, devices: int, seconds: float) -> "StageProfile":
        """A copy with (devices, seconds) added or replaced (a measurement)."""
        kept = tuple(p for p in self.points if p[0] != devices)
        return StageProfile(kept + ((devices, seconds),))
