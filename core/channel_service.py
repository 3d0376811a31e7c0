"""What workers may ask of the controller: channel operations and the custody of
peer-to-peer payloads whose producer stopped before they were fetched.

Items from workers stay encoded (Blob) or are references to a producer's
payload (RemoteRef); a controller-side getter gets them decoded and fetched.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from dynarl.transport.channel import DEFAULT_CAPACITY, Channel, Entry, WouldBlock
from dynarl.transport.data_plane import PayloadFetcher, PayloadLost
from dynarl.transport.wire import Blob, RemoteRef, decode_blob

if TYPE_CHECKING:
    from dynarl.core.worker_handle import WorkerHandle


class ChannelService:
    def __init__(self, channels: dict[str, Channel]) -> None:
        self.channels = channels
        self.fetcher: PayloadFetcher | None = None
        """Set when the controller has sockets (not under the inproc launcher)."""
        self.rehomed: dict[tuple[str, int], Blob] = {}
        """Payloads whose producer stopped before they were fetched, by (address, id)."""

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
            blob = self.rehomed.pop((item.address, item.id), None)
            if blob is None:
                if self.fetcher is None:
                    raise PayloadLost("a peer-to-peer item reached a controller without a data plane")
                try:
                    blob = await self.fetcher.fetch(item)
                except PayloadLost:  # its producer may have stopped and re-homed it meanwhile
                    blob = self.rehomed.pop((item.address, item.id), None)
                    if blob is None:
                        raise
            item = blob
        return decode_blob(item) if isinstance(item, Blob) else item

    async def serve(self, handle: "WorkerHandle", method: str, args: list) -> Any:
        if method == "__payload__":
            return self._serve_payload(*args)
        if method != "__channel__" or len(args) < 2:
            raise PermissionError(f"workers may not call {method!r} on the controller")
        op, name, *rest = args
        channel = self.channel(name)
        worker = handle.spec.worker_id
        if op == "put_many":  # accepted whole; the reply says whether there is room for more
            channel.put_many_nowait([tuple(row) for row in rest[0]], producer=worker)
            return len(channel) < channel.capacity
        if op == "wait_room":
            await channel.wait_room()
            return None
        if op == "get_many":  # [item, weight, affinity] rows, so that the consumer can give them back
            key, max_items = rest
            entries = [await channel.get_entry(key, worker)]
            while len(entries) < max_items:
                try:
                    entries.append(channel.take_nowait(key, worker))
                except WouldBlock:
                    break
            return [[self._rehomed_or(e.item), e.weight, e.affinity] for e in entries]
        if op == "get_batch":
            target, key = rest
            return [self._rehomed_or(item) for item in await channel.get_batch_raw(target, key, worker)]
        if op == "abandon":  # a stopping consumer: its waiting gets end (without an item)
            return channel.abandon(worker)
        if op == "give_back":  # prefetched rows a stopping consumer did not take
            key, rows = rest
            channel.give_back(key, worker, [Entry(item, float(weight), affinity) for item, weight, affinity in rows])
            return None
        if op == "statistics":
            return dataclasses.asdict(channel.statistics())
        raise ValueError(f"unknown channel operation {op!r}")

    def _rehomed_or(self, item: Any) -> Any:
        """A ref whose producer stopped travels as its bytes instead."""
        if isinstance(item, RemoteRef):
            return self.rehomed.pop((item.address, item.id), item)
        return item

    def _serve_payload(self, op: str, address: str, ref_id: int, blob: Blob | None = None) -> Any:
        if op == "rehome":
            ref = RemoteRef(address, ref_id, blob.nbytes)
            if not any(ch.replace_item(ref, blob) for ch in self.channels.values()):
                self.rehomed[(address, ref_id)] = blob  # a consumer already holds the ref
            return None
        if op == "fetch":
            blob = self.rehomed.pop((address, ref_id), None)
            if blob is None:
                raise PayloadLost(f"payload {ref_id} of {address} is gone")
            return blob
        raise ValueError(f"unknown payload operation {op!r}")
