"""Busy intervals of one rank: when its engine computed (steps, passes), for the
device-seconds a component used (`dynarl sim`'s idle fraction, the timeline)."""
from __future__ import annotations


class BusyLog:
    """[start, end] intervals in loop time, merged where they touch."""

    __slots__ = ("intervals",)

    def __init__(self) -> None:
        self.intervals: list[list[float]] = []

    def add(self, start: float, end: float) -> None:
        if end <= start:
            return
        last = self.intervals[-1] if self.intervals else None
        if last is not None and start - last[1] <= 1e-9:
            last[1] = max(last[1], end)
        else:
            self.intervals.append([start, end])

    @property
    def seconds(self) -> float:
        return sum(e - s for s, e in self.intervals)
