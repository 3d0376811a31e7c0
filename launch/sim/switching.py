"""Busy intervals and parking for the simulator's workers."""
from __future__ import annotations

import asyncio


def add_busy(busy: list[list[float]], start: float, end: float) -> None:
    """Appends [start, end], merging it into the last interval when they touch."""
    if end <= start:
        return
    if busy and start - busy[-1][1] <= 1e-9:
        busy[-1][1] = max(busy[-1][1], end)
    else:
        busy.append([start, end])


class Parking:
    """park() / unpark() for a sim worker whose devices the rollout may borrow
    (dynarl's start): `home` is clear while parked (state offloaded to host memory),
    and the worker's stage waits on it before taking any input."""
    home: asyncio.Event

    def _init_home(self) -> None:
        self.home = asyncio.Event()
        self.home.set()

    def park(self) -> None:
        self.home.clear()

    def unpark(self) -> None:
        self.home.set()

