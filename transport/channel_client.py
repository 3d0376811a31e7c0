"""A worker's handle on a controller-owned channel.

Puts are pipelined: put() hands the item (encoded once, as a Blob) to a local
outbox and returns; one flusher sends the outbox in batches, at most one batch
in flight. put() waits only when `window` items are unacknowledged, which keeps
backpressure from the controller's bounded channel while a sequential producer
still sends many items per round trip. `flush()` waits until all are accepted.

Large items (over P2P_ABOVE_BYTES) stay with the producer and travel as a
RemoteRef; the consumer fetches the bytes peer-to-peer (data_plane.py).

Gets fetch up to `prefetch` immediately-available items per round trip and
start fetching their peer-to-peer payloads at once, so transfers overlap.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from typing import Any, Awaitable, Callable, Hashable

from dynarl.transport.data_plane import P2P_ABOVE_BYTES, PayloadFetcher, PayloadLost, PayloadServer
from dynarl.transport.errors import ChannelClosed, RemoteError
from dynarl.transport.wire import Blob, RemoteRef, decode_blob, encode_blob

Call = Callable[[str, list, dict], Awaitable[Any]]
FETCH_ATTEMPT_S = 5.0
FETCH_TIMEOUT_S = 120.0


class ChannelClient:
    def __init__(self, name: str, call: Call, *, prefetch: int = 1, window: int = 64,
                 spawn: Callable[[Awaitable[Any]], asyncio.Task],
                 payloads: PayloadServer | None = None, fetcher: PayloadFetcher | None = None) -> None:
        if prefetch < 1 or window < 1:
            raise ValueError("prefetch and window must be >= 1")
        self.name = name
        self._call = call
        self._prefetch = prefetch
        self._window = window
        self._spawn = spawn
        self._payloads = payloads
        self._fetcher = fetcher
        self._outbox: list[list[Any]] = []
        self._unacked = 0
        self._changed = asyncio.Event()
        self._flusher: asyncio.Task | None = None
        self._error: BaseException | None = None
        self._buffers: dict[Hashable, deque[asyncio.Future]] = defaultdict(deque)

    async def put(self, item: Any, key: Hashable = None, weight: float = 1.0, affinity: str | None = None) -> None:
        self._raise_if_failed()
        while self._unacked >= self._window:
            self._changed.clear()
            await self._changed.wait()
            self._raise_if_failed()
        blob = encode_blob(item)
        wire_item: Any = blob
        if self._payloads is not None and blob.nbytes > P2P_ABOVE_BYTES:
            wire_item = self._payloads.offer(blob)
        self._outbox.append([wire_item, key, weight, affinity])
        self._unacked += 1
        if self._flusher is None or self._flusher.done():
            self._flusher = self._spawn(self._flush_outbox())

    async def flush(self) -> None:
        while self._unacked:
            self._changed.clear()
            await self._changed.wait()
        self._raise_if_failed()

    async def get(self, key: Hashable = None) -> Any:
        buffer = self._buffers[key]
        if not buffer:
            items = await self._op("get_many", key, self._prefetch)
            buffer.extend(self._spawn(self._resolve(item)) for item in items)
        return await buffer.popleft()

    async def get_batch(self, target_weight: float, key: Hashable = None) -> list[Any]:
        items = await self._op("get_batch", target_weight, key)
        return list(await asyncio.gather(*(self._resolve(item) for item in items)))

    async def statistics(self) -> dict:
        return await self._op("statistics")

    async def _resolve(self, item: Any) -> Any:
        if isinstance(item, RemoteRef):
            item = await self._fetch(item)
        return decode_blob(item) if isinstance(item, Blob) else item

    async def _fetch(self, ref: RemoteRef) -> Blob:
        """From the producer; if it does not answer in FETCH_ATTEMPT_S, or no longer
        has the payload, from the controller, where a stopping producer re-homes it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FETCH_TIMEOUT_S
        while True:
            try:
                if self._fetcher is None:
                    raise PayloadLost("this worker has no data plane")
                return await self._fetcher.fetch(ref, timeout_s=FETCH_ATTEMPT_S)
            except PayloadLost:
                pass
            try:
                return await self._call("__payload__", ["fetch", ref.address, ref.id], {})
            except RemoteError as exc:
                if exc.type_name != "PayloadLost" or loop.time() > deadline:
                    raise PayloadLost(f"payload {ref.id} of {ref.address}: {exc.remote_message}") from None

    async def _flush_outbox(self) -> None:
        while self._outbox:
            batch, self._outbox = self._outbox, []
            try:
                await self._op("put_many", batch)
            except BaseException as exc:
                self._error = exc
                self._unacked = 0
                self._changed.set()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                return
            self._unacked -= len(batch)
            self._changed.set()

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
