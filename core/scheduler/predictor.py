"""Throughput per component as a function of its devices: profiled points plus an
online correction from measured throughput.

Dynamic (concave) components, rollout above all, are capped by demand: with
`active_requests` left, more engines than requests add nothing. Static (linear)
components scale with devices between profiled points.
"""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field


@dataclass(slots=True)
class ThroughputModel:
    points: list[tuple[int, float]]
    """Profiled (devices, work units per second), devices increasing."""
    correction: float = 1.0
    """Measured / predicted, smoothed: the online regression's state."""
    smoothing: float = 0.3
    observations: int = 0
    _xs: tuple[list[tuple[int, float]], list[int]] | None = field(default=None, repr=False, compare=False)
    """(points, their device counts): rate()'s abscissae, kept while `points` is the same list."""

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError("a throughput model needs at least one profiled point")
        self.points = sorted(self.points)
        if any(d <= 0 or r < 0 for d, r in self.points):
            raise ValueError("profiled points need devices > 0 and rate >= 0")

    def rate(self, devices: int) -> float:
        """Interpolated between points; proportional beyond them (linear scaling)."""
        if devices <= 0:
            return 0.0
        cached = self._xs
        if cached is None or cached[0] is not self.points:
            cached = self._xs = (self.points, [d for d, _ in self.points])
        xs = cached[1]
        i = bisect_left(xs, devices)
        if i < len(xs) and xs[i] == devices:
            base = self.points[i][1]
        elif i == 0:
            base = self.points[0][1] * devices / xs[0]
        elif i == len(xs):
            base = self.points[-1][1] * devices / xs[-1]
        else:
            (d0, r0), (d1, r1) = self.points[i - 1], self.points[i]
            base = r0 + (r1 - r0) * (devices - d0) / (d1 - d0)
        return base * self.correction

    def observe(self, devices: int, measured_rate: float) -> None:
        """Folds a measurement into the correction factor (exponential smoothing)."""
        predicted = self.rate(devices) / self.correction
        if predicted <= 0 or measured_rate < 0:
            return
        ratio = measured_rate / predicted
        self.correction = ratio if self.observations == 0 else (
            (1 - self.smoothing) * self.correction + self.smoothing * ratio)
        self.observations += 1


@dataclass(slots=True)
class Predictor:
    models: dict[str, ThroughputModel] = field(default_factory=dict)

    def knows(self, component: str) -> bool:
        return component in self.models

    def rate(self, component: str, devices: int, devices_per_engine: int = 1,
             demand_cap: int | None = None) -> float:
        """Work units per second of `component` on `devices`; with `demand_cap`
        (requests still running), engines beyond that cap add nothing."""
        if demand_cap is not None:
            devices = min(devices, max(demand_cap, 0) * devices_per_engine)
        return self.models[component].rate(devices)
