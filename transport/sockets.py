"""ZeroMQ sockets carrying wire messages: the controller's ROUTER, a worker's DEALER,
and the worker's heartbeat thread.

Every socket bounds its frames before they are allocated (ZMQ_MAXMSGSIZE: ZeroMQ
closes the connection of a peer that announces a bigger one); the controller's
ROUTER counts such connections, closed before they delivered one authenticated
message, as rejected ("dropped_connection"), read from its socket monitor.

The ROUTER sets ROUTER_MANDATORY: a message to a vanished peer raises instead of
being dropped silently, and high-water marks are raised because ROUTER drops
messages past its HWM (docs/MEASURED.md); our own flow control (bounded channels,
bounded call windows) keeps memory in check.

Sockets are plain (not zmq.asyncio) and driven from the loop: non-blocking
sends, and receives that drain whatever is queued and otherwise wait for the
socket's file descriptor. zmq.asyncio's per-call futures cost more than the
round trip itself on a 2-core machine (profiled: ~2/3 of the controller's time).
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import threading
import time
from typing import Any, Callable

import zmq
from zmq.utils.monitor import parse_monitor_message

from dynarl.transport import tempdirs
from dynarl.transport.liveness import PeerWatch, enable_heartbeats
from dynarl.transport.replay import ReplayWindow
from dynarl.transport.rejects import RejectCounter
from dynarl.transport.wire import Codec, WireError

log = logging.getLogger(__name__)

HWM = 100_000
HEARTBEAT_SUFFIX = b"#hb"
FIRST_BEAT_LINGER_MS = 200
"""How long a heartbeat socket's close waits for a beat still queued (a controller
that is gone costs a stopping worker this much at most)."""


COPY_ABOVE_BYTES = 64 << 10
DRAIN_BUDGET = 256
"""Messages handled per wake-up before the loop runs its other callbacks."""
REJECT_PAUSE_S = 0.002
"""The pause before reading on when most of a wake-up's messages were rejected (a
flood): the peers' own messages wait that long at most, since ZeroMQ queues each
peer's messages apart and serves them in turn."""

# Plain ints: pyzmq's flags are enums, and enum arithmetic in the per-message path
# cost several microseconds a round trip (profiled).
_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
_NOBLOCK, _SNDMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE)
_SRCFD = int(zmq.SRCFD)


def _configure(sock: zmq.Socket, max_frame_bytes: int) -> None:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
    sock.setsockopt(zmq.SNDHWM, HWM)
    sock.setsockopt(zmq.RCVHWM, HWM)


class LoopSocket:
    """A plain zmq socket used from one asyncio loop.

    Receiving is callback-driven: when the socket's FD signals, `on_frames` runs
    for every queued message right there in the reader callback, which saves a
    task wake-up per message compared with awaiting a receive."""

    def __init__(self, ctx: zmq.Context, kind: int, max_frame_bytes: int) -> None:
        self.sock = ctx.socket(kind)
        _configure(self.sock, max_frame_bytes)
        self._fd = self.sock.getsockopt(zmq.FD)
        self._loop: asyncio.AbstractEventLoop  # set by receive_forever, before any reading
        self._on_frames: Callable[[list[zmq.Frame]], bool | None] | None = None
        self._paused = False

    async def receive_forever(self, on_frames: Callable[[list[zmq.Frame]], bool | None]) -> None:
        """Delivers messages to `on_frames` until cancelled; it returns True for a
        message it rejected (a flood of those is read at a bounded pace)."""
        self._loop = asyncio.get_running_loop()
        self._on_frames = on_frames
        self._loop.add_reader(self._fd, self._drain)
        self._drain()  # anything that arrived before we started listening
        try:
            await self._loop.create_future()  # runs until cancelled
        finally:
            self._on_frames = None
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)

    def drain(self) -> None:
        """Handles the messages queued now (when listening; not while paused by a flood)."""
        self._drain()

    def _drain(self) -> None:
        # The FD is edge-triggered: read until empty, or a message could sit unseen.
        # Asking EVENTS first is cheaper than a receive that ends in zmq.Again (an
        # exception per wake-up: ~10% of a round trip, profiled).
        if self._paused:
            return
        sock = self.sock
        budget, rejected = DRAIN_BUDGET, 0
        while self._on_frames is not None and sock.get(_EVENTS) & _POLLIN:
            if budget == 0:  # a flood must not hold the loop: the rest after what is ready,
                if 2 * rejected > DRAIN_BUDGET:  # or, when most of it was refused, a pause
                    self._pause()  # (the CPU for the others)
                else:
                    self._loop.call_soon(self._drain)
                return
            budget -= 1
            try:
                frames = [sock.recv(_NOBLOCK, copy=False)]
                while sock.get(_RCVMORE):  # the rest of a multipart message is already here
                    frames.append(sock.recv(_NOBLOCK, copy=False))
            except zmq.Again:
                return
            try:
                if self._on_frames(frames):
                    rejected += 1
            except Exception:
                # Keep draining: returning here would leave the FD's edge consumed
                # with messages still queued, and the socket deaf for good.
                log.exception("a message handler failed; the socket keeps serving")

    def _pause(self) -> None:
        """Stops reading for REJECT_PAUSE_S (the FD would wake the reader at once)."""
        self._paused = True
        self._loop.remove_reader(self._fd)
        self._loop.call_later(REJECT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        self._paused = False
        if self._on_frames is not None and not self._loop.is_closed():
            self._loop.add_reader(self._fd, self._drain)
            self._drain()

    async def send_multipart(self, frames: list) -> None:
        while not self.try_send(frames):
            await asyncio.sleep(0.001)  # peer past its high-water mark: back off

    def try_send(self, frames: list) -> bool:
        """Sends without waiting; False when the peer is past its high-water mark."""
        large = any(memoryview(f).nbytes > COPY_ABOVE_BYTES for f in frames if not isinstance(f, bytes))
        sock, copy, last = self.sock, not large, len(frames) - 1
        try:
            # the first frame decides: once it is queued, the rest of the message follows
            for i, frame in enumerate(frames):
                sock.send(frame, _NOBLOCK | _SNDMORE if i < last else _NOBLOCK, copy=copy)
        except zmq.Again:
            return False
        # A send can consume the FD's edge for messages that arrived meanwhile.
        if self._on_frames is not None and sock.get(_EVENTS) & _POLLIN:
            self._loop.call_soon(self._drain)
        return True

    def close(self, linger_ms: int = 0) -> None:
        self._on_frames = None
        self.sock.close(linger=linger_ms)


class RouterServer:
    """The controller's socket. Routes each received body to the handler
    registered for the sender's identity; unknown senders go to `on_unknown`."""

    def __init__(self, codec: Codec, bind: str | None = "tcp://127.0.0.1:0", *, local_ipc: bool = True) -> None:
        """Binds `bind` (TCP, for peers on other nodes; None: none, so no other local
        user can even connect) and, with `local_ipc`, a Unix socket in a fresh 0700
        directory for peers on this host: ~10% faster round trips here, and only this
        user can connect to it."""
        if bind is None and not local_ipc:
            raise ValueError("a RouterServer needs a TCP bind or the local IPC socket")
        self.codec = codec
        self._ctx = zmq.Context()
        self._sock = LoopSocket(self._ctx, zmq.ROUTER, codec.max_message_bytes)
        self._sock.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._monitor = self._sock.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._peer_of_fd: dict[int, bytes] = {}
        """Connections that delivered an authenticated message, with their peer's identity."""
        self.address: str | None = None
        if bind is not None:
            self._sock.sock.bind(bind)
            self.address = self._sock.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._ipc_dir: str | None = None
        self.local_address = self.address
        if local_ipc:
            self._ipc_dir = tempdirs.make("ctl")  # 0700
            self.local_address = f"ipc://{os.path.join(self._ipc_dir, 'controller')}"
            self._sock.sock.bind(self.local_address)
        self.rejects = RejectCounter("the controller")
        self.window = ReplayWindow()
        self.routes: dict[bytes, Callable[[Any], None]] = {}
        self.last_seen: dict[bytes, float] = {}
        self.on_unknown: Callable[[bytes, Any], None] | None = None
        self.on_disconnect: Callable[[bytes], None] | None = None
        """Called with a known peer's identity when its connection closes (its process
        exited, or its ZMTP heartbeats went unanswered: its host or the network is down)."""

    async def send(self, identity: bytes, body: Any) -> None:
        frames = self.codec.encode(body)
        await self._sock.send_multipart([identity, *frames])

    def send_nowait(self, identity: bytes, body: Any) -> bool:
        """Sends `body` to `identity` now if the socket takes it (False: use send)."""
        return self._sock.try_send([identity, *self.codec.encode(body)])

    async def serve(self) -> None:
        """Receives forever. Consumes: messages from any peer. Unblocked by:
        cancellation (shutdown). A rejected message is counted and dropped."""
        loop = asyncio.get_running_loop()

        def on_frames(frames: list[zmq.Frame]) -> bool:
            identity = frames[0].bytes
            peer = identity.removesuffix(HEARTBEAT_SUFFIX)
            try:
                body = self.codec.decode(frames[1:], self.window)
            except WireError as exc:
                self.rejects.add(exc.reason, peer, exc)
                return True
            self.last_seen[peer] = loop.time()
            self._peer_of_fd[frames[1].get(_SRCFD)] = identity
            if identity.endswith(HEARTBEAT_SUFFIX):
                handler = self.routes.get(peer)
                if handler is not None and isinstance(body, dict):
                    handler(body)
                return False
            handler = self.routes.get(identity)
            if handler is not None:
                handler(body)
            elif self.on_unknown is not None:
                self.on_unknown(identity, body)
            else:
                self.rejects.add("unknown_peer", identity)
                return True
            return False

        monitor_fd = self._monitor.getsockopt(zmq.FD)
        loop.add_reader(monitor_fd, self._disconnects)
        self._disconnects()
        try:
            await self._sock.receive_forever(on_frames)
        finally:
            if not loop.is_closed():
                loop.remove_reader(monitor_fd)

    def _disconnects(self) -> None:
        """A closed connection that never delivered an authenticated message is counted
        as rejected: ZeroMQ cut it for a frame over max_message_bytes (before
        allocating it) or a protocol error, or its peer gave up. A known peer's goes to
        `on_disconnect` (a worker's loss is reported by liveness, from its heartbeats)."""
        # A peer's last messages may still wait in the socket when its close is seen
        # (a worker that stopped at once): read them first, so its connection is known.
        self._sock.drain()
        while self._monitor.get(_EVENTS) & _POLLIN:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(_NOBLOCK))
            except zmq.Again:
                return
            fd = event["value"]
            peer = self._peer_of_fd.pop(fd, None)
            if peer is not None:
                if self.on_disconnect is not None:
                    self.on_disconnect(peer)
            else:
                self.rejects.add("dropped_connection", event["endpoint"],
                                 "a connection closed before it delivered an authenticated message "
                                 f"(a frame over {self.codec.max_message_bytes} bytes, or a protocol error)")

    def close(self) -> None:
        self.rejects.flush()
        self._sock.sock.disable_monitor()
        self._monitor.close(0)  # before the context's term, which it would block
        self._sock.close()
        self._ctx.term()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


class DealerClient:
    """A worker's (or agent's) connection to the controller."""

    def __init__(self, codec: Codec, address: str, identity: bytes,
                 liveness: tuple[float, float] | None = None) -> None:
        """`liveness`: (interval_s, lost_after_s): watch the controller (`self.watch`, a
        PeerWatch, liveness.py): ZMTP heartbeats every interval_s, the connection dropped
        after lost_after_s / 2 without an answer, and the peer lost once unreachable for
        lost_after_s / 2 more, so a dead host is seen within ~lost_after_s, a dead process
        (its connection closes at once) within lost_after_s / 2. Needs a running loop."""
        self.codec = codec
        self._ctx = zmq.Context()
        self._sock = LoopSocket(self._ctx, zmq.DEALER, codec.max_message_bytes)
        self._sock.sock.setsockopt(zmq.IDENTITY, identity)
        self.watch: PeerWatch | None = None
        if liveness is not None:
            interval_s, lost_after_s = liveness
            enable_heartbeats(self._sock.sock, interval_s, lost_after_s / 2)
            # before connect(): a handshake that completes first would never be reported
            self.watch = PeerWatch(self._sock.sock, lost_after_s / 2)
        self._sock.sock.connect(address)
        self.rejects = RejectCounter("a worker")
        self.window = ReplayWindow()

    async def send(self, body: Any) -> None:
        await self._sock.send_multipart(self.codec.encode(body))

    def send_nowait(self, body: Any) -> bool:
        """Sends `body` now if the socket takes it (False: it would block; use send)."""
        return self._sock.try_send(self.codec.encode(body))

    async def serve(self, handler: Callable[[Any], None]) -> None:
        def on_frames(frames: list[zmq.Frame]) -> bool:
            try:
                body = self.codec.decode(frames, self.window)
            except WireError as exc:
                self.rejects.add(exc.reason, "the controller side", exc)
                return True
            handler(body)
            return False

        await self._sock.receive_forever(on_frames)

    def close(self, linger_ms: int = 0) -> None:
        """`linger_ms` > 0 lets queued messages (a last reply) go out first."""
        if self.watch is not None:
            self.watch.close()  # its monitor socket would keep the context from terminating
        self._sock.close(linger_ms)
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
        self._stopping = threading.Event()  # (not _stop: Thread._stop is a method that fork calls)

    def run(self) -> None:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        _configure(sock, self._codec.max_message_bytes)
        sock.setsockopt(zmq.IDENTITY, self._identity)
        sock.connect(self._address)
        try:
            # The first beat goes at once: a connection that closes before it delivered an
            # authenticated message is counted by the controller as rejected (RouterServer
            # ._disconnects), and a worker that lives less than one interval is normal.
            self._beat(sock)
            while not self._stopping.wait(self._interval):
                self._beat(sock)
        finally:
            # a short linger lets a beat still queued (a worker that stopped at once) leave
            sock.close(linger=FIRST_BEAT_LINGER_MS)
            ctx.term()

    def _beat(self, sock: zmq.Socket) -> None:
        body = {"k": "event", "e": "heartbeat", "d": {"lag": self._loop_lag()}}
        try:
            sock.send_multipart(self._codec.encode(body), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the controller is not reading; it will notice the silence

    def stop(self) -> None:
        self._stopping.set()


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
