"""Channels: named, keyed, bounded queues between components.

The controller owns every channel. Producers and consumers are workers (through
`ChannelClient`) or the controller's own coroutines. Items from workers are kept
as encoded `Blob`s, so the controller routes them without decoding payloads.

Load balancing: when several consumers wait on one key, an arriving item goes
to the consumer that has received the least total weight so far (ties: the one
waiting longest), unless the item prefers a waiting consumer (affinity).
Waiting getters sit in a heap keyed by (weight served, arrival) with lazy
deletion, and in a per-consumer queue for affinity, so a put costs O(log n)
even with thousands of waiting consumers (a 4096-device simulation has ~2k).
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Hashable

from dynarl.transport.errors import ChannelClosed
from dynarl.transport.wire import Blob, RemoteRef, decode_blob


class WouldBlock(Exception):
    """get_nowait found nothing to take."""


@dataclass(slots=True)
class Entry:
    item: Any
    weight: float
    affinity: str | None


@dataclass(slots=True)
class _Getter:
    future: asyncio.Future
    """Resolves to the delivered Entry."""
    key: Hashable
    consumer: str | None
    seq: int
    gone: bool = False
    """Served or given up: left in the heap, skipped when met (lazy deletion)."""


@dataclass(slots=True)
class ChannelStatistics:
    name: str
    size: int
    capacity: int
    weight: float
    per_key: dict[str, int]
    puts: int
    gets: int
    waiting_putters: int
    waiting_getters: int
    served_weight: dict[str, float] = field(default_factory=dict)
    producers: dict[str, int] = field(default_factory=dict)
    """Items put, by producer ("" for the controller's own code)."""
    closed: bool = False


class Channel:
    def __init__(self, name: str, capacity: int = 1024,
                 resolve: Callable[[Any], Awaitable[Any]] | None = None) -> None:
        """`resolve` turns a stored item into the value a controller-side getter
        sees (decoding Blobs, fetching peer-to-peer payloads)."""
        if capacity < 1:
            raise ValueError(f"channel capacity must be >= 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._resolve = resolve or _decode_local
        self._queues: dict[Hashable, deque[Entry]] = defaultdict(deque)
        self._getters: dict[Hashable, list[tuple[float, int, _Getter]]] = defaultdict(list)
        """Per key: a heap of (weight served to the consumer when pushed, seq, getter)."""
        self._by_consumer: dict[tuple[Hashable, str | None], deque[_Getter]] = defaultdict(deque)
        self._putters: deque[asyncio.Future] = deque()
        self._served: dict[str, float] = defaultdict(float)
        self._producers: dict[str, int] = defaultdict(int)
        self._seq = itertools.count()
        self._size = 0
        self._weight = 0.0
        self.puts = 0
        self.gets = 0
        self.closed = False

    def __len__(self) -> int:
        return self._size

    # --- put ------------------------------------------------------------------
    async def put(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None,
                  producer: str | None = None) -> None:
        """Waits while the channel is full (backpressure)."""
        while True:
            if self.closed:
                raise ChannelClosed(f"channel {self.name!r} is closed")
            if self._size < self.capacity:
                break
            fut = asyncio.get_running_loop().create_future()
            self._putters.append(fut)
            try:
                await fut
            finally:
                if fut in self._putters:
                    self._putters.remove(fut)
        self.put_nowait(item, key, weight, affinity, producer)

    def put_nowait(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None,
                   producer: str | None = None) -> None:
        if self.closed:
            raise ChannelClosed(f"channel {self.name!r} is closed")
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        self.puts += 1
        self._producers[producer or ""] += 1
        entry = Entry(item, float(weight), affinity)
        getter = self._pick_getter(key, affinity)
        if getter is not None:
            self._deliver(getter, entry)
            return
        self._queues[key].append(entry)
        self._size += 1
        self._weight += entry.weight

    # --- get ------------------------------------------------------------------
    async def get(self, key: Hashable = None, consumer: str | None = None) -> Any:
        return await self._resolve(await self.get_raw(key, consumer))

    def get_nowait(self, key: Hashable = None, consumer: str | None = None) -> Any:
        queue = self._queues.get(key)
        if queue and isinstance(queue[_preferred_index(queue, consumer)].item, RemoteRef):
            raise WouldBlock("the next item is a peer-to-peer payload: use `await get()`")
        return _decode_local_now(self.get_raw_nowait(key, consumer))

    async def get_batch(self, target_weight: float, key: Hashable = None, consumer: str | None = None) -> list[Any]:
        """Items until their weights sum to at least `target_weight`. After close,
        returns what is left (a short batch); raises ChannelClosed when nothing is."""
        return [await self._resolve(item) for item in await self.get_batch_raw(target_weight, key, consumer)]

    # The *_raw forms hand out items as stored: Blobs from workers stay encoded
    # when the controller forwards them to another worker.
    async def get_raw(self, key: Hashable = None, consumer: str | None = None) -> Any:
        return (await self._get_entry(key, consumer)).item

    def get_raw_nowait(self, key: Hashable = None, consumer: str | None = None) -> Any:
        return self._take(key, consumer).item

    async def get_batch_raw(self, target_weight: float, key: Hashable = None,
                            consumer: str | None = None) -> list[Any]:
        items: list[Any] = []
        total = 0.0
        while total < target_weight:
            try:
                entry = await self._get_entry(key, consumer)
            except ChannelClosed:
                if items:
                    return items
                raise
            items.append(entry.item)
            total += entry.weight
        return items

    async def _get_entry(self, key: Hashable, consumer: str | None) -> Entry:
        try:
            return self._take(key, consumer)
        except WouldBlock:
            pass
        if self.closed:
            raise ChannelClosed(f"channel {self.name!r} is closed and drained")
        getter = _Getter(asyncio.get_running_loop().create_future(), key, consumer, next(self._seq))
        heapq.heappush(self._getters[key], (self._served[consumer or ""], getter.seq, getter))
        mine = self._by_consumer[(key, consumer)]
        while mine and mine[0].gone:  # served through the heap meanwhile: drop, or they pile up
            mine.popleft()
        mine.append(getter)
        try:
            return await getter.future
        finally:
            getter.gone = True

    def _take(self, key: Hashable, consumer: str | None) -> Entry:
        queue = self._queues.get(key)
        if not queue:
            raise WouldBlock
        index = _preferred_index(queue, consumer)
        entry = queue[index]
        del queue[index]
        self._size -= 1
        self._weight -= entry.weight
        self._account(consumer, entry)
        self._wake_putter()
        return entry

    def close(self) -> None:
        """No more puts. Getters drain what is queued, then get ChannelClosed."""
        if self.closed:
            return
        self.closed = True
        for heap in self._getters.values():
            for _, _, getter in heap:
                if not getter.gone and not getter.future.done():
                    getter.future.set_exception(ChannelClosed(f"channel {self.name!r} is closed"))
        self._getters.clear()
        self._by_consumer.clear()
        for fut in self._putters:
            if not fut.done():
                fut.set_result(None)  # they wake, see `closed` and raise

    def replace_item(self, old: Any, new: Any) -> bool:
        """Swaps a queued item in place (a peer-to-peer ref whose payload moved)."""
        for queue in self._queues.values():
            for entry in queue:
                if entry.item == old:
                    entry.item = new
                    return True
        return False

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(
            name=self.name, size=self._size, capacity=self.capacity, weight=self._weight,
            per_key={str(k): len(q) for k, q in self._queues.items() if q},
            puts=self.puts, gets=self.gets, waiting_putters=len(self._putters),
            waiting_getters=sum(1 for heap in self._getters.values() for _, _, g in heap
                                if not g.gone and not g.future.done()),
            served_weight=dict(self._served), producers=dict(self._producers), closed=self.closed)

    # --- internals -------------------------------------------------------------
    def _pick_getter(self, key: Hashable, affinity: str | None) -> _Getter | None:
        if affinity is not None:
            waiting = self._by_consumer.get((key, affinity))
            while waiting:
                getter = waiting.popleft()
                if not getter.gone and not getter.future.done():
                    return getter
        heap = self._getters.get(key)
        while heap:
            served, seq, getter = heap[0]
            if getter.gone or getter.future.done():
                heapq.heappop(heap)
                continue
            current = self._served[getter.consumer or ""]
            if current != served:  # its consumer was served since: re-key, look again
                heapq.heapreplace(heap, (current, seq, getter))
                continue
            return getter
        return None

    def _deliver(self, getter: _Getter, entry: Entry) -> None:
        getter.gone = True
        self._account(getter.consumer, entry)
        getter.future.set_result(entry)

    def _account(self, consumer: str | None, entry: Entry) -> None:
        self.gets += 1
        self._served[consumer or ""] += entry.weight

    def _wake_putter(self) -> None:
        while self._putters:
            fut = self._putters.popleft()
            if not fut.done():
                fut.set_result(None)
                return


def _preferred_index(queue: deque[Entry], consumer: str | None) -> int:
    """The first item meant for `consumer` or for anyone; else the oldest (affinity
    is a preference: an item does not wait for a consumer that is not asking)."""
    if consumer is not None:
        for i, entry in enumerate(queue):
            if entry.affinity is None or entry.affinity == consumer:
                return i
    return 0


def _decode_local_now(item: Any) -> Any:
    return decode_blob(item) if isinstance(item, Blob) else item


async def _decode_local(item: Any) -> Any:
    return _decode_local_now(item)
