"""ZeroMQ sockets carrying wire messages: the controller's ROUTER, a worker's DEALER,
and the worker's heartbeat thread.

The ROUTER sets ROUTER_MANDATORY: a message to a vanished peer raises instead of
being dropped silently, and high-water marks are raised because ROUTER drops
messages past its HWM (MEASURED.md); our own flow control (bounded channels,
bounded call windows) keeps memory in check.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any, Callable

import zmq
import zmq.asyncio

from dynarl.transport.wire import Codec, RejectCounter, WireError

log = logging.getLogger(__name__)

HWM = 100_000
HEARTBEAT_SUFFIX = b"#hb"


def _configure(sock: zmq.Socket) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)


class RouterServer:
    """The controller's socket. Routes each received body to the handler
    registered for the sender's identity; unknown senders go to `on_unknown`."""

    def __init__(self, codec: Codec, bind: str = "tcp://127.0.0.1:0") -> None:
        self.codec = codec
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        _configure(self._sock)
        self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._sock.bind(bind)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.rejects = RejectCounter()
        self.routes: dict[bytes, Callable[[Any], None]] = {}
        self.last_seen: dict[bytes, float] = {}
        self.on_unknown: Callable[[bytes, Any], None] | None = None

    async def send(self, identity: bytes, body: Any) -> None:
        frames = self.codec.encode(body)
        await self._sock.send_multipart([identity, *frames], copy=False)

    async def serve(self) -> None:
        """Receives forever. Consumes: messages from any peer. Unblocked by:
        cancellation (shutdown). A rejected message is counted and dropped."""
        loop = asyncio.get_running_loop()
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            identity = frames[0].bytes
            peer = identity.removesuffix(HEARTBEAT_SUFFIX)
            try:
                body = self.codec.decode(frames[1:])
            except WireError as exc:
                self.rejects.add(exc.reason)
                log.warning("rejected a message from %r: %s", peer, exc)
                continue
            self.last_seen[peer] = loop.time()
            if identity.endswith(HEARTBEAT_SUFFIX):
                handler = self.routes.get(peer)
                if handler is not None and isinstance(body, dict):
                    handler(body)
                continue
            handler = self.routes.get(identity)
            if handler is not None:
                handler(body)
            elif self.on_unknown is not None:
                self.on_unknown(identity, body)
            else:
                self.rejects.add("unknown_peer")

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()


class DealerClient:
    """A worker's (or agent's) connection to the controller."""

    def __init__(self, codec: Codec, address: str, identity: bytes) -> None:
        self.codec = codec
        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        _configure(self._sock)
        self._sock.setsockopt(zmq.IDENTITY, identity)
        self._sock.connect(address)
        self.rejects = RejectCounter()

    async def send(self, body: Any) -> None:
        await self._sock.send_multipart(self.codec.encode(body), copy=False)

    async def serve(self, handler: Callable[[Any], None]) -> None:
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            try:
                body = self.codec.decode(frames)
            except WireError as exc:
                self.rejects.add(exc.reason)
                log.warning("rejected a message from the controller side: %s", exc)
                continue
            handler(body)

    def close(self, linger_ms: int = 0) -> None:
        """`linger_ms` > 0 lets queued messages (a last reply) go out first."""
        self._sock.close(linger=linger_ms)
        self._ctx.term()


class HeartbeatThread(threading.Thread):
    """Sends a heartbeat every `interval` seconds from its own thread and socket, so
    a worker busy in long synchronous compute (a big train step) still looks alive.
    Each beat carries the event loop's lag: the controller declares a worker hung
    when its loop has not ticked for longer than its hang bound."""

    def __init__(self, secret: bytes, address: str, identity: bytes, interval: float,
                 loop_lag: Callable[[], float]) -> None:
        super().__init__(name="dynarl-heartbeat", daemon=True)
        self._codec = Codec(secret)
        self._address = address
        self._identity = identity + HEARTBEAT_SUFFIX
        self._interval = interval
        self._loop_lag = loop_lag
        self._stop = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        _configure(sock)
        sock.setsockopt(zmq.IDENTITY, self._identity)
        sock.connect(self._address)
        try:
            while not self._stop.wait(self._interval):
                body = {"k": "event", "e": "heartbeat", "d": {"lag": self._loop_lag()}}
                try:
                    sock.send_multipart(self._codec.encode(body), flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass  # the controller is not reading; it will notice the silence
        finally:
            sock.close(linger=0)
            ctx.term()

    def stop(self) -> None:
        self._stop.set()


class LoopTicker:
    """Tracks when the event loop last ran a callback (for the hang signal)."""

    def __init__(self, interval: float) -> None:
        self._interval = interval
        self._last = time.monotonic()

    async def run(self) -> None:
        while True:
            self._last = time.monotonic()
            await asyncio.sleep(self._interval)

    def lag(self) -> float:
        return max(0.0, time.monotonic() - self._last - self._interval)
