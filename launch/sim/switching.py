"""Role switches on time-shared devices: what onload/offload cost an emulated worker."""
from __future__ import annotations

import asyncio

from dynarl.components.costmodel import ROLE_SWITCH_S


async def half_switch(shares_device: bool, time_scale: float) -> None:
    """Offloading one role and onloading the next cost ROLE_SWITCH_S together
    (COSTMODEL.md §3); each half is spent on the side that moves."""
    if shares_device:
        await asyncio.sleep(ROLE_SWITCH_S / 2 * time_scale)


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

