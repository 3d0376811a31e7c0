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

from dynarl.transport.backpressure import Room
from dynarl.transport.custody import Custody, name_key
from dynarl.transport.errors import ChannelClosed
from dynarl.transport.wire import Blob, RemoteRef, decode_blob


DEFAULT_CAPACITY = 1024
COMPACT_ABOVE = 64
"""A key's getter heap is compacted when it holds more than this and twice the
getters alive at its last compaction (amortised O(1) per get)."""


class WouldBlock(Exception):
    """get_nowait found nothing to take."""


@dataclass(slots=True)
class Entry:
    item: Any
    weight: float
    affinity: str | None
    names: tuple = ()
    """What the item was made of (its producer's `made_of`): its names in Custody."""


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
    def __init__(self, name: str, capacity: int = DEFAULT_CAPACITY,
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
        self._room = Room(name, lambda: self._size < self.capacity)
        self._served: dict[str, float] = defaultdict(float)
        self._producers: dict[str, int] = defaultdict(int)
        self._live_at_compaction: dict[Hashable, int] = {}
        self._seq = itertools.count()
        self._size = 0
        self._weight = 0.0
        self.puts = 0
        self.gets = 0
        self.closed = False
        self.custody: Custody | None = None
        """Set: who holds the items taken from this channel (Custody)."""
        self.releases: Channel | None = None
        """Set: puts here that carry idents release them from that channel's custody."""

    def __len__(self) -> int:
        return self._size

    # --- put ------------------------------------------------------------------
    async def put(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None,
                  producer: str | None = None) -> None:
        """Puts `item` under `key` with `weight` (what get_batch sums) and `affinity` (a
        consumer it prefers); waits while the channel is full (backpressure)."""
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        await self._room.turn()  # in the order the putters came (transport/backpressure.py)
        self.put_nowait(item, key, weight, affinity, producer)

    async def wait_room(self) -> None:
        """Returns once the channel holds fewer items than its capacity (a worker's
        flusher, before it sends its next batch), taking no turn from the putters."""
        await self._room.watch()

    def put_nowait(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None,
                   producer: str | None = None, names: tuple = ()) -> None:
        """`names`: what the item was made of (Custody)."""
        if self.closed:
            raise ChannelClosed(f"channel {self.name!r} is closed")
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        self.puts += 1
        self._producers[producer or ""] += 1
        entry = Entry(item, float(weight), affinity, names)
        getter = self._pick_getter(key, affinity)
        if getter is not None:
            self._deliver(getter, entry)
            return
        self._queues[key].append(entry)
        self._size += 1
        self._weight += entry.weight

    def put_many_nowait(self, items: list[tuple], producer: str | None = None) -> None:
        """Enqueues every item at once, past the capacity if need be: a worker's batch of
        puts is accepted whole as it arrives (so none is lost to a cancelled wait), and
        its client waits for room (wait_room) before it sends the next batch, which
        bounds the overshoot to one batch (the client's window) per producer."""
        if self.closed:
            raise ChannelClosed(f"channel {self.name!r} is closed")
        for row in items:
            if row[2] < 0:
                raise ValueError(f"weight must be >= 0, got {row[2]}")
        for item, key, weight, affinity, *names in items:  # (item, key, weight, affinity[, names])
            self.put_nowait(item, key, weight, affinity, producer, tuple(map(name_key, names[0])) if names else ())

    def give_back(self, key: Hashable, consumer: str | None, entries: list[Entry]) -> None:
        """Entries handed to `consumer` that it could not take after all (its get was
        cancelled, it stopped with them prefetched) go back to the front of their queue,
        in order, or straight to a consumer waiting for them; they count as not got."""
        for entry in entries:
            self.gets -= 1
            self._served[consumer or ""] -= entry.weight
            if self.custody is not None and consumer:
                self.custody.returned(consumer, entry)
        queued = []
        for entry in entries:
            getter = self._pick_getter(key, entry.affinity)
            if getter is not None:
                self._deliver(getter, entry)
            else:
                queued.append(entry)
        if queued:
            self._queues[key].extendleft(reversed(queued))
            self._size += len(queued)
            self._weight += sum(e.weight for e in queued)

    # --- get ------------------------------------------------------------------
    async def get(self, key: Hashable = None, consumer: str | None = None) -> Any:
        """The next item under `key`, waiting for one; ChannelClosed once closed and
        empty. `consumer`: who takes it (load balancing, affinity; None: the controller)."""
        return await self._resolve((await self.get_entry(key, consumer)).item)

    def get_nowait(self, key: Hashable = None, consumer: str | None = None) -> Any:
        """The next item under `key` if one is queued (else WouldBlock)."""
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
    def get_raw_nowait(self, key: Hashable = None, consumer: str | None = None) -> Any:
        return self.take_nowait(key, consumer).item

    async def get_batch_raw(self, target_weight: float, key: Hashable = None,
                            consumer: str | None = None) -> list[Any]:
        entries: list[Entry] = []
        total = 0.0
        try:
            while total < target_weight:
                entry = await self.get_entry(key, consumer)
                entries.append(entry)
                total += entry.weight
        except ChannelClosed:
            if not entries:
                raise
        except asyncio.CancelledError:
            self.give_back(key, consumer, entries)  # a batch cut short takes nothing
            raise
        return [e.item for e in entries]

    async def get_entry(self, key: Hashable = None, consumer: str | None = None) -> Entry:
        """The item as stored, with its weight and affinity (what give_back needs)."""
        try:
            return self.take_nowait(key, consumer)
        except WouldBlock:
            pass
        if self.closed:
            raise ChannelClosed(f"channel {self.name!r} is closed and drained")
        getter = _Getter(asyncio.get_running_loop().create_future(), key, consumer, next(self._seq))
        heap = self._getters[key]
        heapq.heappush(heap, (self._served[consumer or ""], getter.seq, getter))
        if len(heap) > max(COMPACT_ABOVE, 2 * self._live_at_compaction.get(key, 0)):
            self._compact(key)
        self._by_consumer[(key, consumer)].append(getter)  # (trimmed as gets end: _forget_idle)
        try:
            return await getter.future
        except asyncio.CancelledError:
            fut = getter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.give_back(key, consumer, [fut.result()])  # delivered, then cancelled: not taken
            raise
        finally:
            getter.gone = True
            self._forget_idle(key, consumer)

    def _compact(self, key: Hashable) -> None:
        """Drops served and abandoned getters from a key's heap (they pile up under
        affinity deliveries, which take getters from the per-consumer queues)."""
        live = [(s, q, g) for s, q, g in self._getters[key] if not g.gone and not g.future.done()]
        heapq.heapify(live)
        self._getters[key] = live
        self._live_at_compaction[key] = len(live)

    def _forget_idle(self, key: Hashable, consumer: str | None) -> None:
        """Per-key and per-consumer bookkeeping goes once it holds nothing (keys can be
        many: one per episode or per rank). Trims only what is done at the front, like
        the lazy deletion in _pick_getter, so a get costs O(1) here."""
        mine = self._by_consumer.get((key, consumer))
        if mine is not None:
            while mine and mine[0].gone:
                mine.popleft()
            if not mine:
                del self._by_consumer[(key, consumer)]
        heap = self._getters.get(key)
        if heap is not None:
            while heap and (heap[0][2].gone or heap[0][2].future.done()):
                heapq.heappop(heap)
            if not heap:
                del self._getters[key]
                self._live_at_compaction.pop(key, None)

    def take_nowait(self, key: Hashable = None, consumer: str | None = None) -> Entry:
        queue = self._queues.get(key)
        if not queue:
            raise WouldBlock
        index = _preferred_index(queue, consumer)
        entry = queue[index]
        del queue[index]
        if not queue:
            del self._queues[key]
        self._size -= 1
        self._weight -= entry.weight
        self._account(consumer, entry)
        self._room.taken()
        return entry

    def abandon(self, consumer: str) -> int:
        """A stopping consumer's waiting getters end with ChannelClosed; an item already
        handed to one stays handed (its get returns it). Returns how many were waiting."""
        count = 0
        for (key, who), waiting in list(self._by_consumer.items()):
            if who != consumer:
                continue
            for getter in waiting:
                if not getter.gone and not getter.future.done():
                    getter.gone = True
                    getter.future.set_exception(ChannelClosed(f"{consumer} stopped waiting on {self.name!r}"))
                    count += 1
        return count

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
        self._room.close()

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
            per_key={repr(k) if not isinstance(k, str) else k: len(q) for k, q in self._queues.items() if q},
            puts=self.puts, gets=self.gets, waiting_putters=len(self._room.putters),
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
        if self.custody is not None and consumer:
            self.custody.took(consumer, entry)

    def reclaim(self, consumer: str) -> int:
        """A lost consumer's items (Custody) go back to the front of the queue, in the
        order it took them, for the others; returns how many were work (had an ident)."""
        if self.custody is None:
            raise ValueError(f"channel {self.name!r} keeps no custody")
        entries = self.custody.reclaim(consumer)
        self.give_back(None, consumer, entries)
        return sum(1 for e in entries if self.custody.names(e))


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
