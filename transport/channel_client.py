"""A worker's handle on a controller-owned channel.

Puts are pipelined: put() hands the item (encoded once, as a Blob) to a local
outbox and returns; one flusher sends the outbox in batches, at most one batch
in flight. The controller takes a batch whole and replies whether the channel has
room; if not, the flusher waits for room before the next batch (so a channel holds
at most its capacity plus one batch per producer, and no batch is ever half taken).
put() waits when `window` items are unacknowledged. `flush()` waits until all are in
the channel; `flush(force=True)` (a stopping worker) does not wait for room.

Large items (over P2P_ABOVE_BYTES) stay with the producer and travel as a
RemoteRef; the consumer fetches the bytes peer-to-peer (data_plane.py).

Gets fetch up to `prefetch` immediately-available items per round trip and
start fetching their peer-to-peer payloads at once, so transfers overlap.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Hashable

from dynarl.transport.data_plane import P2P_ABOVE_BYTES, PayloadFetcher, PayloadLost, PayloadServer
from dynarl.transport.errors import ChannelClosed, RemoteError
from dynarl.transport.wire import Blob, RemoteRef, decode_blob, encode_blob

Call = Callable[[str, list, dict], Awaitable[Any]]
FETCH_ATTEMPT_S = 5.0
FETCH_TIMEOUT_S = 120.0
GIVE_BACK_FETCH_S = 1.0
"""How long a stopping consumer waits for payloads already being fetched before it
gives their refs back instead (its stop has a grace period of seconds)."""


def _decoded(value: Any, error: BaseException | None) -> Any:
    """A _fetched result as the value a get returns (or its error raised)."""
    if error is not None:
        raise error
    return decode_blob(value) if isinstance(value, Blob) else value


async def _error_of(awaitable: Awaitable[Any]) -> BaseException | None:
    """Awaits; returns the exception instead of raising it (for tasks in a worker's
    TaskGroup, where a failed task would stop the worker)."""
    try:
        await awaitable
    except Exception as exc:
        return exc
    return None


class ChannelPutFailed(Exception):
    """Items put on a channel could not be delivered (the channel closed, the
    controller went away); the message says how many."""


@dataclass(slots=True)
class _Taken:
    """An item this consumer took from the channel and has not handed out yet."""
    item: Any
    """As it came: a Blob, plain data, or a RemoteRef."""
    weight: float
    affinity: str | None
    fetch: asyncio.Future
    """Its bytes: (Blob or plain data, None), or (None, the error)."""
    key: Hashable = None
    given_back: bool = False
    """A stop gave it back to the channel while a get waited for its bytes."""
    names: list | None = None
    """Its custody names, from a channel that keeps custody (given back with it)."""
    ref_returned: bool = False
    """What went back was the ref itself (its bytes had not come): a fetch that ends
    later must not release the producer's copy, the next consumer needs it."""


class ChannelClient:
    def __init__(self, name: str, call: Call, *, prefetch: int = 1, window: int = 64,
                 spawn: Callable[[Awaitable[Any]], asyncio.Task],
                 payloads: PayloadServer | None = None, fetcher: PayloadFetcher | None = None,
                 share_items: bool = False) -> None:
        """`share_items`: put items go to the channel as they are, not encoded (the
        inproc launcher, whose ranks share the controller's memory as its RPC arguments
        do): a consumer gets the producer's object."""
        if window < 1:
            raise ValueError("window must be >= 1")
        self._share_items = share_items
        self.name = name
        self._call = call
        self.prefetch = prefetch
        self._window = window
        self._spawn = spawn
        self._payloads = payloads
        self._fetcher = fetcher
        self._outbox: list[list[Any]] = []
        self._unacked = 0
        self._changed = asyncio.Event()
        self._flusher: asyncio.Task | None = None
        self._room_wait: asyncio.Task | None = None
        self._forcing = False
        """Stopping: what is unsent goes out without waiting for room."""
        self._full = False
        """The channel said it had no room after our last batch."""
        self._stopping = False
        """give_back() ran: no more gets."""
        self._error: BaseException | None = None
        self._buffers: dict[Hashable, deque[_Taken]] = defaultdict(deque)
        self._handing: list[_Taken] = []
        """Taken off a buffer by a get still waiting for the bytes (give_back sees them)."""
        self._filling: dict[Hashable, asyncio.Task] = {}
        self.in_custody = False
        """The channel keeps custody of what this consumer takes (transport/channel.py
        Custody): what it makes of an item goes downstream `made_of` its names."""

    # --- put ------------------------------------------------------------------------
    async def put(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None,
                  made_of: list | None = None) -> None:
        """Puts `item` (plain data, arrays, tensors, registered records: wire.py) under
        `key`, with `weight` (what get_batch sums and load balancing counts) and
        `affinity` (a consumer's worker id it prefers). Returns once the item is in the
        local outbox: `flush()` waits for delivery, and a failed delivery is raised by a
        later put or flush (ChannelPutFailed). Waits while `window` items are unacknowledged.
        `made_of`: the idents of the items taken from the channel this one releases
        (transport/custody.py Custody) that this item was made of; they are released
        when it arrives, and its bytes go with it (not peer to peer: a producer lost
        after the put must not take them along)."""
        self._raise_if_failed()
        while self._unacked >= self._window:
            self._changed.clear()
            await self._changed.wait()
            self._raise_if_failed()
        wire_item: Any = item
        if not self._share_items:
            blob = wire_item = encode_blob(item)
            if self._payloads is not None and blob.nbytes > P2P_ABOVE_BYTES and made_of is None:
                wire_item = self._payloads.offer(blob)
        self._outbox.append([wire_item, key, weight, affinity] + ([list(made_of)] if made_of is not None else []))
        self._unacked += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush_outbox())

    async def put_all(self, items: list[Any], made_of: list) -> None:
        """Several items made of the same upstream items (`made_of`, released with them):
        they go in one message, whole (a producer lost midway delivers none of them)."""
        self._raise_if_failed()
        while self._unacked >= self._window:
            self._changed.clear()
            await self._changed.wait()
            self._raise_if_failed()
        for i, item in enumerate(items):  # no await in between: the flusher sends them in one batch
            wire_item = item if self._share_items else encode_blob(item)
            self._outbox.append([wire_item, None, 1.0, None, list(made_of) if i == len(items) - 1 else []])
        self._unacked += len(items)
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush_outbox())

    async def flush(self, *, force: bool = False) -> None:
        """Waits until every put item is in the channel. `force` (a stopping worker):
        the rest goes out now, past the channel's capacity, instead of waiting for room."""
        if force:
            self._forcing = True
            if self._room_wait is not None:
                self._room_wait.cancel()
        while self._unacked:
            self._changed.clear()
            await self._changed.wait()
        self._raise_if_failed()

    async def _flush_outbox(self) -> None:
        """Sends the outbox batch by batch. The controller takes a batch whole and says
        whether the channel has room; if not, the next batch (when there is one) first
        waits for room: backpressure without ever holding a batch half-taken. Never
        raises but when cancelled: a failure is kept and raised to the next put or flush."""
        while self._outbox:
            if self._full and not self._forcing:
                waiter = self._room_wait = self._spawn(_error_of(self._op("wait_room")))
                try:
                    await asyncio.wait([waiter])
                except asyncio.CancelledError as exc:
                    waiter.cancel()
                    self._fail_unsent(0, exc)
                    raise
                finally:
                    self._room_wait = None
                error = None if waiter.cancelled() else waiter.result()
                if error is not None and not self._forcing:
                    self._fail_unsent(0, error)
                    return
            batch, self._outbox = self._outbox, []
            try:
                room = await self._op("put_many", batch)
            except BaseException as exc:
                self._fail_unsent(len(batch), exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            self._full = not room
            self._unacked -= len(batch)
            self._changed.set()

    def _fail_unsent(self, in_flight: int, exc: BaseException) -> None:
        """Kept and raised to the next put or flush, which stop waiting."""
        lost = in_flight + len(self._outbox)
        self._outbox = []
        self._error = ChannelPutFailed(f"{lost} items put on channel {self.name!r} were not delivered: {exc!r}")
        self._unacked = 0
        self._changed.set()

    # --- get ------------------------------------------------------------------------
    @property
    def prefetch(self) -> int:
        """Items a get asks for per round trip (the channel hands out at most one END
        per trip: channel_service `_more`)."""
        return self._prefetch

    @prefetch.setter
    def prefetch(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"prefetch must be >= 1, got {value}")
        self._prefetch = value

    async def get(self, key: Hashable = None) -> Any:
        """The next item under `key`, waiting for one; ChannelClosed once the channel is
        closed and holds nothing more for this key. Cancelling a get loses nothing: a fetch from the channel in
        flight goes on and its items wait here for the next get (or go back to the
        channel when this worker stops)."""
        buffer = self._buffers[key]
        while not buffer:
            if self._stopping:  # (also for a get that waited on a fill while give_back ran)
                raise ChannelClosed(f"channel {self.name!r}: this worker is stopping")
            fill = self._filling.get(key)
            if fill is None:
                fill = self._filling[key] = self._spawn(self._fill(key))
            error = await asyncio.shield(fill)
            if error is not None:
                raise error
        taken = buffer.popleft()
        self._handing.append(taken)
        try:
            fetched = await asyncio.shield(taken.fetch)
        except asyncio.CancelledError:
            if taken.ref_returned and taken.fetch.cancelled():  # give_back ended its fetch
                raise ChannelClosed(f"channel {self.name!r}: this worker is stopping") from None
            if not taken.given_back:
                buffer.appendleft(taken)
            raise
        finally:
            self._handing.remove(taken)
        if taken.given_back:
            raise ChannelClosed(f"channel {self.name!r}: this worker is stopping")
        return _decoded(*fetched)

    async def _fill(self, key: Hashable) -> BaseException | None:
        """One round trip: up to `prefetch` items into the buffer, their peer-to-peer
        payloads fetching at once. Returns the error instead of raising (a failed task
        would take the worker's TaskGroup down)."""
        try:
            rows = await self._op("get_many", key, self._prefetch)
            for item, weight, affinity, *held in rows:  # (held: [names, True] from a channel in custody)
                if held:
                    self.in_custody = True
                taken = _Taken(item, weight, affinity, None, key, names=held[0] if held else None)  # type: ignore[arg-type]
                taken.fetch = self._spawn(self._fetched(item, taken))
                self._buffers[key].append(taken)
            return None
        except Exception as exc:
            return exc
        finally:
            if self._filling.get(key) is asyncio.current_task():
                del self._filling[key]

    async def _fetched(self, item: Any, taken: _Taken | None = None) -> tuple[Any, BaseException | None]:
        """The item's bytes (a ref's fetched, then released where they came from unless
        a stop has meanwhile given the ref itself back), or the error."""
        if not isinstance(item, RemoteRef):
            return item, None
        try:
            blob, from_controller = await self._fetch(item)
        except Exception as exc:
            return None, exc
        if taken is None or not taken.ref_returned:
            # Decided here, with no await since the fetch: give_back sees this task done.
            self._spawn(_error_of(self._release(item, from_controller)))
        return blob, None

    async def get_batch(self, target_weight: float, key: Hashable = None) -> list[Any]:
        """Items under `key` until their weights sum to at least `target_weight` (after
        close: what is left; ChannelClosed when nothing is)."""
        items = await self._op("get_batch", target_weight, key)
        return list(await asyncio.gather(*(self._resolve(item) for item in items)))

    async def give_back(self) -> int:
        """A stopping consumer: items it took but did not hand out go back to the
        channel, in order (with their bytes where already fetched peer-to-peer: the
        producer gave its copy away). Gets still waiting are ended by the channel
        (`abandon`) and awaited, not cancelled: an item the channel handed to one just
        before arrives here and goes back with the rest. No get runs after this."""
        self._stopping = True
        filling = list(self._filling.values())  # (a fill that ends meanwhile leaves _filling)
        if filling:
            await self._op("abandon")
            await asyncio.wait(filling)
        returned = 0
        for key, buffer in list(self._buffers.items()):
            # first those a get took off the buffer but is still waiting for: it will not return them
            taken, rows = [t for t in self._handing if t.key == key] + list(buffer), []
            buffer.clear()
            for t in taken:
                t.given_back = True
            if taken:  # a payload still on its way gets a moment; else its ref goes back
                await asyncio.wait([t.fetch for t in taken], timeout=GIVE_BACK_FETCH_S)
            for t in taken:
                fetched = t.fetch.done() and t.fetch.result()[1] is None
                t.ref_returned = not fetched
                rows.append([t.fetch.result()[0] if fetched else t.item, t.weight, t.affinity]
                            + ([t.names] if t.names is not None else []))
                if t.ref_returned:  # the producer keeps the bytes for the next consumer
                    t.fetch.cancel()
            if rows:
                await self._op("give_back", key, rows)
                returned += len(rows)
        return returned

    async def statistics(self) -> dict:
        return await self._op("statistics")

    async def _resolve(self, item: Any) -> Any:
        return _decoded(*await self._fetched(item))

    async def _release(self, ref: RemoteRef, from_controller: bool) -> None:
        if from_controller:
            await self._call("__payload__", ["release", ref.address, ref.id], {})
        elif self._fetcher is not None:
            await self._fetcher.release(ref)

    async def _fetch(self, ref: RemoteRef) -> tuple[Blob, bool]:
        """From the producer; if it does not answer in FETCH_ATTEMPT_S, or no longer
        has the payload, from the controller, where a stopping producer re-homes it.
        Returns the bytes and whether they came from the controller."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FETCH_TIMEOUT_S
        pause = 0.05
        while True:
            try:
                if self._fetcher is None:
                    raise PayloadLost("this worker has no data plane")
                return await self._fetcher.fetch(ref, timeout_s=FETCH_ATTEMPT_S), False
            except PayloadLost:
                pass
            try:
                return await self._call("__payload__", ["fetch", ref.address, ref.id], {}), True
            except RemoteError as exc:
                if exc.type_name != "PayloadLost" or loop.time() > deadline:
                    raise PayloadLost(exc.remote_message) from None
            await asyncio.sleep(pause)  # the producer may be re-homing it right now
            pause = min(1.0, 2 * pause)

    async def _op(self, op: str, *args: Any) -> Any:
        try:
            return await self._call("__channel__", [op, self.name, *args], {})
        except RemoteError as exc:
            if exc.type_name == "ChannelClosed":
                raise ChannelClosed(exc.remote_message) from None
            if exc.type_name == "PayloadLost":
                raise PayloadLost(exc.remote_message) from None
            raise

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error
