"""device_lock: controller-managed locks that time-share devices between groups.

A group takes the locks of all its devices (in id order, so two groups can't
deadlock), then its workers onload; before the locks go, they offload. Locks are
FIFO, so the order of acquisition follows the order the workflow asks in, which
follows the data dependencies.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from contextlib import asynccontextmanager
from typing import AsyncIterator


class LockManager:
    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.holders: dict[int, str] = {}

    @asynccontextmanager
    async def hold(self, owner: str, devices: list[int]) -> AsyncIterator[None]:
        taken: list[int] = []
        try:
            for device in sorted(set(devices)):
                await self._locks[device].acquire()
                taken.append(device)
                self.holders[device] = owner
            yield
        finally:
            for device in reversed(taken):
                self.holders.pop(device, None)
                self._locks[device].release()

    def statistics(self) -> dict[int, dict]:
        return {device: {"holder": self.holders.get(device), "locked": lock.locked()}
                for device, lock in sorted(self._locks.items())}
