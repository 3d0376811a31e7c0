"""The floor under our RPC round trip: a bare ZeroMQ echo between two processes.

The same topology as a local worker's call (this process's ROUTER, a child
process's DEALER, over IPC), a message the size of our no-op call and reply, and
nothing else: no codec, no MAC, no RPC bookkeeping. Two variants:

- blocking: both ends block in zmq_recv, no event loop. Whatever our stack adds
  sits on top of this, so `ray_rtt / floor` is the most any RPC layer over ZeroMQ
  could reach against Ray on this machine, in the same run.
- loop: both ends wait in a uvloop for the socket's file descriptor and drain it
  from the reader callback, as our controller and workers do (transport/sockets.py
  LoopSocket). The difference to the blocking echo is what driving ZeroMQ from an
  asyncio loop costs; the rest of our round trip is our codec and RPC layer.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import zmq

from dynarl.transport import tempdirs

MESSAGE_BYTES = 70
"""About our no-op call on the wire: the 37-byte preamble (magic, version, MAC kind,
nonce, tag) and a ~30-byte msgpack body."""

_ECHO = """
import sys, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])
sock.send(b"ready")
while (msg := sock.recv()) != b"stop":
    sock.send(msg)
"""

_LOOP_ECHO = """
import asyncio, sys, uvloop, zmq
sock = zmq.Context().socket(zmq.DEALER)
sock.connect(sys.argv[1])

async def main():
    loop = asyncio.get_running_loop()
    stopped = loop.create_future()

    def drain():
        while not stopped.done() and sock.get(zmq.EVENTS) & zmq.POLLIN:
            msg = sock.recv(zmq.NOBLOCK)
            if msg == b"stop":
                stopped.set_result(None)
            else:
                sock.send(msg, zmq.NOBLOCK)
    loop.add_reader(sock.getsockopt(zmq.FD), drain)
    sock.send(b"ready")
    drain()
    await stopped
uvloop.run(main())
"""


def measure_zmq_floor(calls: int, loop: bool = False) -> list[float]:
    """Microseconds per round trip, one at a time, after a warm-up; `loop`: both ends
    driven by a uvloop (the module's second variant)."""
    folder = tempdirs.make("floor")
    address = f"ipc://{os.path.join(folder, 'echo')}"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVTIMEO, 10_000)  # a child that died does not hang the bench
    router.bind(address)
    child = subprocess.Popen([sys.executable, "-c", _LOOP_ECHO if loop else _ECHO, address])
    try:
        identity, _ = router.recv_multipart()
        message = b"x" * MESSAGE_BYTES
        if loop:
            import uvloop
            rtts = uvloop.run(_loop_round_trips(router, identity, message, calls))
        else:
            rtts = []
            for i in range(200 + calls):
                start = time.perf_counter()
                router.send_multipart([identity, message])
                router.recv_multipart()
                if i >= 200:
                    rtts.append((time.perf_counter() - start) * 1e6)
        router.send_multipart([identity, b"stop"])
        child.wait(timeout=10)
        return rtts
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        router.close()
        ctx.term()
        shutil.rmtree(folder, ignore_errors=True)


async def _loop_round_trips(router: zmq.Socket, identity: bytes, message: bytes, calls: int) -> list[float]:
    """The parent's side of the loop variant: send, then a future the reader callback
    resolves with the reply."""
    import asyncio
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future] = []

    def drain() -> None:
        while router.get(zmq.EVENTS) & zmq.POLLIN:
            router.recv_multipart(zmq.NOBLOCK)
            if waiting:
                waiting.pop().set_result(None)
    loop.add_reader(router.getsockopt(zmq.FD), drain)
    try:
        rtts = []
        for i in range(200 + calls):
            start = time.perf_counter()
            reply = loop.create_future()
            waiting.append(reply)
            router.send_multipart([identity, message], zmq.NOBLOCK)
            drain()  # a send can consume the FD's edge
            await reply
            if i >= 200:
                rtts.append((time.perf_counter() - start) * 1e6)
        return rtts
    finally:
        loop.remove_reader(router.getsockopt(zmq.FD))
