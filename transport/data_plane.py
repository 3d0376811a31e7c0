"""Peer-to-peer payloads: large channel items skip the controller.

A producer keeps a large item in its PayloadServer and puts only a RemoteRef
(address, id, size) into the channel; the consumer that gets the ref fetches the
bytes straight from the producer. The controller routes refs like any item, so
ordering, weights, affinity and backpressure are unchanged, while the bytes cross
one hop instead of two.

The producer drops the bytes when the consumer that keeps the item releases them,
not when it answers the fetch: a consumer that stops while its fetch is unanswered
gives the ref back to the channel, and the answer that reaches it later must not
have been the only copy. If the producer is gone before the fetch, the fetch fails
with PayloadLost.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import shutil
from typing import Any

import zmq

from dynarl.transport import tempdirs
from dynarl.transport.errors import DynarlError
from dynarl.transport.endpoints import LOOPBACK, with_host
from dynarl.transport.sockets import LoopSocket
from dynarl.transport.replay import ReplayWindow
from dynarl.transport.wire import Blob, Codec, RemoteRef, WireError

P2P_ABOVE_BYTES = 256 << 10
REQUEST_MAX_BYTES = 4096
"""The largest frame a payload server takes: fetches and releases are a few dozen
bytes; anything bigger is dropped before it is allocated."""
LATE_KEEP_S = 300.0


class PayloadLost(DynarlError):
    """The payload behind a RemoteRef can no longer be fetched."""


class PayloadServer:
    """Holds offered payloads until the consumer that keeps one releases it."""

    def __init__(self, codec: Codec, host: str = "127.0.0.1", advertise: str | None = None) -> None:
        """Binds `host`; consumers are told `advertise` (default: the bound address),
        which must name this node as they reach it when `host` is a wildcard. On
        loopback (every consumer is on this host) it binds a Unix socket in a fresh 0700
        directory instead of a TCP port, so that no other local user can connect."""
        self._codec = codec
        self._window = ReplayWindow()
        self._ctx = zmq.Context()
        self._sock = LoopSocket(self._ctx, zmq.ROUTER, REQUEST_MAX_BYTES)
        self._ipc_dir: str | None = None
        if host in LOOPBACK and advertise in (None, host):
            self._ipc_dir = tempdirs.make("p2p")
            self.address = f"ipc://{os.path.join(self._ipc_dir, 'payloads')}"
            self._sock.sock.bind(self.address)
        else:
            self._sock.sock.bind(f"tcp://{host}:0")
            self.address = self._sock.sock.getsockopt_string(zmq.LAST_ENDPOINT)
            if advertise is not None:
                self.address = with_host(self.address, advertise)
        self._store: dict[int, Blob] = {}
        self._served: set[int] = set()
        """Held payloads a fetch was answered for."""
        self._ids = itertools.count(1)
        self.rejected = 0

    def offer(self, blob: Blob) -> RemoteRef:
        ref_id = next(self._ids)
        self._store[ref_id] = blob
        return RemoteRef(self.address, ref_id, blob.nbytes)

    def withdraw(self, ref: RemoteRef) -> None:
        """Drops an offer nobody will fetch any more (a later fetch finds it missing)."""
        self._drop(ref.id)

    def _drop(self, ref_id: int) -> None:
        self._store.pop(ref_id, None)
        self._served.discard(ref_id)

    def take_all(self) -> list[tuple[RemoteRef, Blob, bool]]:
        """Everything still held, each with whether a fetch was already answered (then a
        consumer most likely has the bytes and its release is on the way or lost)."""
        held = [(RemoteRef(self.address, ref_id, blob.nbytes), blob, ref_id in self._served)
                for ref_id, blob in self._store.items()]
        self._store.clear()
        self._served.clear()
        return held

    @property
    def held_bytes(self) -> int:
        return sum(b.nbytes for b in self._store.values())

    async def serve(self) -> None:
        """Answers fetches forever. Unblocked by: cancellation."""
        loop = asyncio.get_running_loop()

        def on_frames(frames: list) -> None:
            identity = frames[0].bytes
            try:
                request = self._codec.decode(frames[1:], self._window)
                if "release" in request:
                    self._drop(int(request["release"]))
                    return
                ref_id = int(request["fetch"])
            except (WireError, KeyError, TypeError, ValueError):
                self.rejected += 1
                return
            blob = self._store.get(ref_id)
            if blob is not None:
                self._served.add(ref_id)
            reply = {"id": ref_id, "blob": blob} if blob is not None else {"id": ref_id, "missing": True}
            loop.create_task(self._sock.send_multipart([identity, *self._codec.encode(reply)]))

        await self._sock.receive_forever(on_frames)

    def close(self) -> None:
        self._sock.close()
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


class PayloadFetcher:
    """Fetches RemoteRefs; one connection per producer, replies matched by id."""

    def __init__(self, codec: Codec, spawn: Any) -> None:
        self._codec = codec
        self._window = ReplayWindow()
        self._spawn = spawn
        self._ctx = zmq.Context()
        self._peers: dict[str, LoopSocket] = {}
        self._receivers: list[asyncio.Task] = []
        self._waiting: dict[tuple[str, int], asyncio.Future] = {}
        self._late: dict[tuple[str, int], tuple[float, Blob]] = {}
        """Payloads that arrived after their fetch had timed out, kept for the retry
        (LATE_KEEP_S at most) so that it need not cross the network again."""
        self._done: dict[tuple[str, int], float] = {}
        """Fetches that succeeded lately: a second answer to them (a retry's request and
        the timed-out one both answered) is dropped, not kept in _late."""

    async def fetch(self, ref: RemoteRef, timeout_s: float = 60.0) -> Blob:
        key = (ref.address, ref.id)
        late = self._late.pop(key, None)
        if late is not None:
            self._mark_done(key)
            return late[1]
        sock = self._peers.get(ref.address)
        if sock is None:
            sock = self._peers[ref.address] = LoopSocket(self._ctx, zmq.DEALER, self._codec.max_message_bytes)
            sock.sock.connect(ref.address)
            self._receivers.append(self._spawn(self._receive(ref.address, sock)))
        future = asyncio.get_running_loop().create_future()
        self._waiting[(ref.address, ref.id)] = future
        try:
            await sock.send_multipart(self._codec.encode({"fetch": ref.id}))
            async with asyncio.timeout(timeout_s):
                blob = await future
            self._mark_done(key)
            return blob
        except TimeoutError:
            raise PayloadLost(f"no answer from {ref.address} for payload {ref.id} within {timeout_s} s") from None
        finally:
            self._waiting.pop(key, None)

    async def release(self, ref: RemoteRef) -> None:
        """Tells the producer that this consumer keeps the item: it may drop its copy.
        Not answered; a producer that is gone needs no release."""
        sock = self._peers.get(ref.address)
        if sock is not None:
            await sock.send_multipart(self._codec.encode({"release": ref.id}))

    async def _receive(self, address: str, sock: LoopSocket) -> None:
        def on_frames(frames: list) -> None:
            try:
                reply = self._codec.decode(frames, self._window)
            except WireError:
                return
            key = (address, reply.get("id"))
            future = self._waiting.get(key)
            if future is not None and future.done():
                return  # a second answer to a fetch already answered
            if future is None:
                if not reply.get("missing") and isinstance(reply.get("blob"), Blob) and key not in self._done:
                    self._keep_late(key, reply["blob"])
                return
            if reply.get("missing"):
                future.set_exception(PayloadLost(f"payload {reply['id']} at {address} was already taken or dropped"))
            else:
                future.set_result(reply["blob"])

        await sock.receive_forever(on_frames)

    def _keep_late(self, key: tuple[str, int], blob: Blob) -> None:
        now = asyncio.get_running_loop().time()
        for k in [k for k, (at, _) in self._late.items() if now - at > LATE_KEEP_S]:
            del self._late[k]
        self._late[key] = (now, blob)

    def _mark_done(self, key: tuple[str, int]) -> None:
        now = asyncio.get_running_loop().time()
        while self._done:  # oldest first (insertion order)
            oldest, at = next(iter(self._done.items()))
            if now - at <= LATE_KEEP_S:
                break
            del self._done[oldest]
        self._done.pop(key, None)
        self._done[key] = now

    def stop(self) -> None:
        """Cancels the receive loops (they run until cancelled)."""
        for task in self._receivers:
            task.cancel()

    def close(self) -> None:
        self.stop()
        for sock in self._peers.values():
            sock.close()
        self._ctx.term()
