"""PeerWatch: is the one peer of a connecting socket still reachable?

A node agent on another host has no other way to learn that its controller died:
a DEALER reconnects silently forever, so the agent and the workers it started
would outlive the job (holding their GPUs). ZMTP heartbeats (ZMQ_HEARTBEAT_IVL /
_TIMEOUT) are answered by libzmq's I/O thread, so a controller whose event loop is
busy still answers; a dead process closes its connection at once, and a dead host
or a cut network stops the PONGs. A socket monitor reports the connection going and
coming back; the peer counts as lost once it has stayed unreachable for
`lost_after_s` (a reconnect within that grace, e.g. after a network blip, is fine).
"""
from __future__ import annotations

import asyncio

import zmq
from zmq.utils.monitor import parse_monitor_message

MAX_TTL_MS = 6_553_500
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_UP, _DOWN = int(zmq.EVENT_HANDSHAKE_SUCCEEDED), int(zmq.EVENT_DISCONNECTED)


def enable_heartbeats(sock: zmq.Socket, interval_s: float, timeout_s: float) -> None:
    """ZMTP PINGs every `interval_s`; no traffic for `timeout_s` after one drops the
    connection (and tells the peer the same TTL). Set before connect()."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(interval_s * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(timeout_s * 1000)))
    # deciseconds in a 16-bit field on the wire: libzmq refuses more than 6553.5 s
    sock.setsockopt(zmq.HEARTBEAT_TTL, min(MAX_TTL_MS, max(100, int(timeout_s * 1000))))


class PeerWatch:
    """Watches `sock`'s connection (one peer) from the running loop. Make it before
    sock.connect(): a handshake done before the monitor exists is never reported.
    `connected` is the current state; `lost()` returns once the peer has been
    unreachable for `lost_after_s` (counted from the start if it never connects).
    close() before closing `sock`."""

    def __init__(self, sock: zmq.Socket, lost_after_s: float) -> None:
        if lost_after_s <= 0:
            raise ValueError(f"lost_after_s must be > 0, got {lost_after_s}")
        self.lost_after_s = lost_after_s
        self._sock = sock
        self._monitor: zmq.Socket | None = sock.get_monitor_socket(_WATCHED)
        self._fd = self._monitor.fileno()
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self.connected = False
        self.down_since = self._loop.time()
        self.disconnects = 0
        self._loop.add_reader(self._fd, self._drain)
        self._drain()

    def _drain(self) -> None:
        monitor = self._monitor
        while monitor is not None and monitor.poll(0, zmq.POLLIN):
            event = parse_monitor_message(monitor.recv_multipart(zmq.NOBLOCK))["event"]
            if event == _UP and not self.connected:
                self.connected = True
                self._changed.set()
            elif event == _DOWN and self.connected:
                self.connected = False
                self.down_since = self._loop.time()
                self.disconnects += 1
                self._changed.set()

    async def lost(self) -> float:
        """Waits until the peer has been unreachable for lost_after_s; returns how long."""
        while True:
            self._changed.clear()
            if self.connected:
                await self._changed.wait()
                continue
            left = self.down_since + self.lost_after_s - self._loop.time()
            if left <= 0:
                return self._loop.time() - self.down_since
            try:
                async with asyncio.timeout(left):
                    await self._changed.wait()
            except TimeoutError:
                pass

    def close(self) -> None:
        if self._monitor is None:
            return
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is already closed
        self._monitor.close(linger=0)
        self._monitor = None
