"""Backpressure: a bounded channel's putters wait for room, in the order they came.

A putter that finds room while others wait (or have been woken and not run yet)
waits behind them, and a woken putter that finds the channel full again keeps its
place at the front; else a producer's later put (a rank's END, say) could overtake
its earlier one. One putter is woken per take. Watchers (a worker's flusher, before
it sends its next batch) wait for room without taking a turn: every one is woken
at each take.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

from dynarl.transport.errors import ChannelClosed


class Room:
    def __init__(self, name: str, has_room: Callable[[], bool]) -> None:
        """`name`: the channel's; `has_room`: whether it holds fewer items than its capacity."""
        self.name = name
        self._has_room = has_room
        self.closed = False
        self.putters: deque[asyncio.Future] = deque()
        self._woken: set[asyncio.Future] = set()
        """Putters a take has woken that have not run yet: the room is theirs."""
        self._watchers: deque[asyncio.Future] = deque()

    async def turn(self) -> None:
        """A putter's wait for room."""
        await self._until_room(self.putters, takes_turn=True)

    async def watch(self) -> None:
        """Returns once there is room, taking no turn from the putters."""
        await self._until_room(self._watchers, takes_turn=False)

    async def _until_room(self, waiters: deque[asyncio.Future], takes_turn: bool) -> None:
        woken = False
        while True:
            if self.closed:
                raise ChannelClosed(f"channel {self.name!r} is closed")
            ahead = takes_turn and not woken and (self.putters or self._woken)
            if self._has_room() and not ahead:
                return
            fut = asyncio.get_running_loop().create_future()
            if woken:
                waiters.appendleft(fut)
            else:
                waiters.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut in self._woken:
                    self._woken.discard(fut)
                    self._wake_putter()  # woken, then cancelled: the room goes to the next putter
                raise
            finally:
                if fut in waiters:
                    waiters.remove(fut)
            woken = takes_turn
            self._woken.discard(fut)

    def taken(self) -> None:
        """An item left the channel: one putter and every watcher wake."""
        self._wake_putter()
        while self._watchers:  # emptied in place: _until_room holds this deque
            fut = self._watchers.popleft()
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        """Every waiter wakes and raises ChannelClosed."""
        self.closed = True
        for fut in [*self.putters, *self._watchers]:
            if not fut.done():
                fut.set_result(None)

    def _wake_putter(self) -> None:
        while self.putters:
            fut = self.putters.popleft()
            if not fut.done():
                fut.set_result(None)
                self._woken.add(fut)
                return
