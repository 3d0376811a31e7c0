"""Per-tool call counts and latencies (every call is recorded, rejected ones too)."""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _ToolLatency:
    calls: int = 0
    errors: int = 0
    """Calls that ran and came back with an error (timeout, crash, limit, exception)."""
    rejected: int = 0
    """Malformed requests, answered without running anything."""
    total_s: float = 0.0
    max_s: float = 0.0
    recent: deque = field(default_factory=lambda: deque(maxlen=4096))


class LatencyLog:
    def __init__(self) -> None:
        self._tools: dict[str, _ToolLatency] = {}

    def record(self, tool: str, seconds: float, *, ok: bool, rejected: bool = False) -> None:
        entry = self._tools.setdefault(tool, _ToolLatency())
        entry.calls += 1
        if rejected:
            entry.rejected += 1
        elif not ok:
            entry.errors += 1
        entry.total_s += seconds
        entry.max_s = max(entry.max_s, seconds)
        entry.recent.append(seconds)

    def stats(self) -> dict[str, dict[str, float | int]]:
        """{tool: {calls, errors, rejected, mean_s, p50_s, p95_s, max_s}}; the
        percentiles cover the most recent 4096 calls, the rest all of them."""
        out = {}
        for tool, entry in self._tools.items():
            ordered = sorted(entry.recent)
            out[tool] = {
                "calls": entry.calls, "errors": entry.errors, "rejected": entry.rejected,
                "mean_s": entry.total_s / entry.calls, "p50_s": _percentile(ordered, 0.50),
                "p95_s": _percentile(ordered, 0.95), "max_s": entry.max_s,
            }
        return out


def _percentile(ordered: list[float], q: float) -> float:
    # Nearest rank: always one of the recorded values.
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
