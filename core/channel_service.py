"""What workers may ask of the controller: channel operations and the custody of
peer-to-peer payloads whose producer stopped before they were fetched.

Items from workers stay encoded (Blob) or are references to a producer's
payload (RemoteRef); a controller-side getter gets them decoded and fetched.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from typing import TYPE_CHECKING, Any

from dynarl.transport.channel import DEFAULT_CAPACITY, Channel, Entry, WouldBlock
from dynarl.transport.custody import name_key
from dynarl.transport.errors import ChannelClosed
from dynarl.transport.channel_client import FETCH_ATTEMPT_S, FETCH_TIMEOUT_S
from dynarl.transport.data_plane import PayloadFetcher, PayloadLost
from dynarl.transport.wire import Blob, RemoteRef, decode_blob

if TYPE_CHECKING:
    from dynarl.core.worker_handle import WorkerHandle

log = logging.getLogger(__name__)

REHOMED_KEEP_S = 2 * FETCH_TIMEOUT_S


@dataclasses.dataclass(slots=True)
class Rehomed:
    """A payload whose producer stopped while a consumer held its ref."""
    blob: Blob
    served_at: float | None
    """When a fetch of it was last answered (by the producer or here); None: never."""


class ChannelService:
    def __init__(self, channels: dict[str, Channel]) -> None:
        self.channels = channels
        self.fetcher: PayloadFetcher | None = None
        """Set when the controller has sockets (not under the inproc launcher)."""
        self.rehomed: dict[tuple[str, int], Rehomed] = {}
        """Payloads whose producer stopped while a consumer held their ref, by (address, id)."""
        self.rehomed_dropped = 0

    def channel(self, name: str, capacity: int | None = None) -> Channel:
        """The channel `name`, created on first use with `capacity` (default
        DEFAULT_CAPACITY). Asking an existing channel for another capacity is an error,
        not a silent mismatch (a worker may have created it first)."""
        channel = self.channels.get(name)
        if channel is None:
            channel = self.channels[name] = Channel(name, capacity or DEFAULT_CAPACITY, resolve=self.resolve_item)
        elif capacity is not None and capacity != channel.capacity:
            raise ValueError(f"channel {name!r} exists with capacity {channel.capacity}, not {capacity}: "
                             "create it with its capacity before any worker uses it")
        return channel

    async def resolve_item(self, item: Any) -> Any:
        if isinstance(item, RemoteRef):
            item = await self._fetch(item)
        return decode_blob(item) if isinstance(item, Blob) else item

    async def _fetch(self, ref: RemoteRef) -> Blob:
        """A controller-side get's payload: from the producer, or re-homed here. A
        producer that is stopping has let go of its payloads before they arrive here,
        so a miss is retried (with backoff) until FETCH_TIMEOUT_S, as workers do."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FETCH_TIMEOUT_S
        pause = 0.05
        while True:
            blob = self._take_rehomed(ref)
            if blob is not None:
                return blob
            fetcher = self.fetcher
            if fetcher is None:
                raise PayloadLost("a peer-to-peer item reached a controller without a data plane")
            try:
                blob = await fetcher.fetch(ref, timeout_s=FETCH_ATTEMPT_S)
            except PayloadLost:
                if loop.time() > deadline:
                    raise
            else:
                await _release(fetcher, ref)
                return blob
            await asyncio.sleep(pause)
            pause = min(1.0, 2 * pause)

    async def serve(self, handle: "WorkerHandle", method: str, args: list) -> Any:
        value = self.serve_now(handle, method, args)
        return await value if inspect.isawaitable(value) else value

    def serve_now(self, handle: "WorkerHandle", method: str, args: list) -> Any:
        """A worker's call, answered at once where it can be (the value), else the
        awaitable that answers it (a get from an empty channel, a wait for room): the
        RPC fast path of the inproc launcher, where a task per call is the cost."""
        if method == "__payload__":
            return self._serve_payload(*args)
        if method != "__channel__" or len(args) < 2:
            raise PermissionError(f"workers may not call {method!r} on the controller")
        if handle.lost is not None:  # (its held items may be back with the others: it takes and puts no more)
            raise ChannelClosed(f"{handle.name} is lost")
        op, name, *rest = args
        channel = self.channel(name)
        worker = handle.spec.worker_id
        if op == "put_many":  # accepted whole; the reply says whether there is room for more
            rows = rest[0]
            if any(len(row) not in (4, 5) for row in rows):
                raise ValueError("put_many rows are [item, key, weight, affinity] or [..., idents]")
            channel.put_many_nowait([tuple(row) for row in rows], producer=worker)
            if channel.releases is not None and channel.releases.custody is not None:
                for row in rows:  # what the items were made of is downstream now (transport/custody.py Custody)
                    if len(row) == 5:
                        channel.releases.custody.release(list(row[4]))
            return len(channel) < channel.capacity
        if op == "wait_room":
            return channel.wait_room()
        if op == "get_many":  # [item, weight, affinity] rows, so that the consumer can give them back
            key, max_items = rest
            try:
                first = channel.take_nowait(key, worker)
            except WouldBlock:
                return self._get_many(channel, key, max_items, worker)
            return self._rows(self._more(channel, [first], key, max_items, worker), channel)
        if op == "get_batch":
            target, key = rest
            return self._get_batch(channel, target, key, worker)
        if op == "abandon":  # a stopping consumer: its waiting gets end (without an item)
            return channel.abandon(worker)
        if op == "give_back":  # prefetched rows a stopping consumer did not take
            key, rows = rest
            channel.give_back(key, worker, [Entry(self._rehomed_or(row[0]), float(row[1]), row[2],
                                                  tuple(map(name_key, row[3])) if len(row) > 3 else ())
                                            for row in rows])
            return None
        if op == "statistics":
            return dataclasses.asdict(channel.statistics())
        raise ValueError(f"unknown channel operation {op!r}")

    async def _get_many(self, channel: Channel, key: Any, max_items: int, worker: str) -> list:
        entries = self._more(channel, [await channel.get_entry(key, worker)], key, max_items, worker)
        return self._rows(entries, channel)

    async def _get_batch(self, channel: Channel, target: float, key: Any, worker: str) -> list:
        return [self._rehomed_or(item) for item in await channel.get_batch_raw(target, key, worker)]

    @staticmethod
    def _more(channel: Channel, entries: list[Entry], key: Any, max_items: int, worker: str) -> list[Entry]:
        """Up to `max_items` in all; an END (None, which the controller puts, one per
        consumer of a stage) ends the batch, so no consumer takes a second one."""
        while len(entries) < max_items and entries[-1].item is not None:
            try:
                entries.append(channel.take_nowait(key, worker))
            except WouldBlock:
                break
        return entries

    def _rows(self, entries: list[Entry], channel: Channel) -> list:
        """[item, weight, affinity] per entry; from a channel that keeps custody also its
        names (a consumer that gives it back sends them back) and True: the consumer then
        puts what it makes of them `made_of` (transport/custody.py Custody)."""
        custody = channel.custody
        if custody is None:
            return [[self._rehomed_or(e.item), e.weight, e.affinity] for e in entries]
        return [[self._rehomed_or(e.item), e.weight, e.affinity, list(custody.names(e)), True] for e in entries]

    def _rehomed_or(self, item: Any) -> Any:
        """A ref whose producer stopped travels as its bytes instead (so that no ref in
        a channel ever points at bytes only this service holds)."""
        if isinstance(item, RemoteRef):
            blob = self._take_rehomed(item)
            return item if blob is None else blob
        return item

    def _take_rehomed(self, ref: RemoteRef) -> Blob | None:
        kept = self.rehomed.pop((ref.address, ref.id), None)
        return None if kept is None else kept.blob

    def _serve_payload(self, op: str, address: str, ref_id: int, blob: Blob | None = None,
                       served: bool = False) -> Any:
        self._drop_unclaimed()
        key = (address, ref_id)
        if op == "rehome":
            if blob is None:
                raise ValueError("a rehome brings the payload")
            ref = RemoteRef(address, ref_id, blob.nbytes)
            if not any(ch.replace_item(ref, blob) for ch in self.channels.values()):
                self.rehomed[key] = Rehomed(blob, self._now() if served else None)  # a consumer holds the ref
            return None
        if op == "fetch":  # kept until that consumer releases it (it may stop before the answer)
            kept = self.rehomed.get(key)
            if kept is None:
                raise PayloadLost(f"payload {ref_id} of {address} is gone")
            kept.served_at = self._now()
            return kept.blob
        if op == "release":
            self.rehomed.pop(key, None)
            return None
        raise ValueError(f"unknown payload operation {op!r}")

    def _drop_unclaimed(self) -> None:
        """A re-homed payload that was served (by its producer before it stopped, or by
        this service) is in the hands of the consumer that fetched it, whose release
        may have been lost with the stopped producer or with the consumer itself; a
        consumer still fetching it gives up within FETCH_TIMEOUT_S. So past
        REHOMED_KEEP_S after its last serving, nobody will claim it and it goes. One
        never served is kept: the consumer that holds its ref may not fetch it for a
        long time (a batch still filling, a ref held by controller code)."""
        if not self.rehomed:
            return
        now = self._now()
        stale = [k for k, kept in self.rehomed.items()
                 if kept.served_at is not None and now - kept.served_at > REHOMED_KEEP_S]
        for k in stale:
            del self.rehomed[k]
        if stale:
            self.rehomed_dropped += len(stale)
            log.warning("dropped %d re-homed payloads served over %.0f s ago and never released",
                        len(stale), REHOMED_KEEP_S)

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()


async def _release(fetcher: PayloadFetcher, ref: RemoteRef) -> None:
    """The producer may drop its copy. A release that fails costs only memory there
    (it re-homes the copy when it stops, where it is dropped unclaimed), so it must
    not fail the get that already has the bytes."""
    try:
        await fetcher.release(ref)
    except Exception as exc:
        log.debug("release of payload %d at %s failed: %r", ref.id, ref.address, exc)
