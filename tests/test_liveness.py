"""PeerWatch (transport/liveness.py): a connecting socket learns that its one peer is
gone: killed, frozen (no PONGs), or never there; a peer back within the grace is not
lost. The peer is a bare ROUTER in a process of its own."""
import asyncio
import contextlib
import signal
import subprocess
import sys
import time

import pytest
import zmq

from conftest import assert_reaped
from dynarl.launch.local import free_local_port
from dynarl.transport.liveness import MAX_TTL_MS, PeerWatch, enable_heartbeats
from dynarl.transport.sockets import DealerClient
from dynarl.transport.wire import Codec

ROUTER = "import sys, time, zmq; s = zmq.Context().socket(zmq.ROUTER); s.bind(sys.argv[1]); time.sleep(600)"
# the same, started ahead: it binds when told to (a line on stdin), already past its imports
ROUTER_ON_CUE = ("import sys, time, zmq; s = zmq.Context().socket(zmq.ROUTER); print('ready', flush=True); "
                 "sys.stdin.readline(); s.bind(sys.argv[1]); time.sleep(600)")
HEARTBEAT_S, TIMEOUT_S, GRACE_S = 0.2, 3.0, 1.0
HANG_S = 60.0  # bounds a hang only


def start_router(address: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ROUTER, address])


async def until(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


@pytest.fixture
def dealer():
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RECONNECT_IVL, 50)
    enable_heartbeats(sock, HEARTBEAT_S, TIMEOUT_S)
    yield sock
    ctx.destroy(linger=0)  # never hangs, whatever a failed test left open


@contextlib.contextmanager
def watched(dealer, address: str | None = None, grace_s: float = GRACE_S):
    """A PeerWatch on `dealer` (made before it connects), connected to `address` or to
    nobody; closed on the way out, however the test ends."""
    watch = PeerWatch(dealer, grace_s)
    dealer.connect(address or f"tcp://127.0.0.1:{free_local_port()}")
    try:
        yield watch
    finally:
        watch.close()


@pytest.mark.parametrize("fault", ["killed", "frozen"])
async def test_a_peer_that_is_killed_or_frozen_is_lost(dealer, fault):
    """killed: the connection closes at once (the PONG timeout is made far longer than the
    wait here, so it cannot be what noticed); frozen: the PONGs stop, TIMEOUT_S later it
    drops. Then the grace."""
    if fault == "killed":
        enable_heartbeats(dealer, HEARTBEAT_S, 10 * HANG_S)
    address = f"tcp://127.0.0.1:{free_local_port()}"
    router = start_router(address)
    try:
        with watched(dealer, address) as watch:
            await until(lambda: watch.connected, HANG_S)
            began = time.monotonic()
            router.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
            down_for = await asyncio.wait_for(watch.lost(), HANG_S)
            took = time.monotonic() - began
    finally:
        router.kill()
        router.wait()
    assert not watch.connected and watch.disconnects == 1
    assert down_for >= GRACE_S and took >= GRACE_S
    print(f"{fault}: lost {took:.2f} s after the signal")
    assert_reaped([router.pid])


async def test_a_peer_back_within_the_grace_is_not_lost(dealer):
    """The replacement is started ahead and binds on cue: what has to fit in the grace
    is a reconnect, not a Python start (seconds on a loaded machine)."""
    grace_s = 5.0
    address = f"tcp://127.0.0.1:{free_local_port()}"
    router = start_router(address)
    second = subprocess.Popen([sys.executable, "-c", ROUTER_ON_CUE, address], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert second.stdout.readline() == "ready\n"
        with watched(dealer, address, grace_s) as watch:
            await until(lambda: watch.connected, HANG_S)
            lost = asyncio.ensure_future(watch.lost())
            router.kill()
            router.wait()
            await until(lambda: not watch.connected, HANG_S)
            second.stdin.write("bind\n")  # back on the same address, inside the grace
            second.stdin.flush()
            await until(lambda: watch.connected, grace_s)
            loop = asyncio.get_running_loop()
            await asyncio.sleep(watch.down_since + grace_s + 0.3 - loop.time())  # past the first disconnect's grace
            assert not lost.done()
            lost.cancel()
    finally:
        for proc in (router, second):
            proc.kill()
            proc.wait()
    assert watch.disconnects == 1
    assert_reaped([router.pid, second.pid])


async def test_a_peer_that_never_answers_is_lost_after_the_grace(dealer):
    with watched(dealer) as watch:  # nobody listens there
        began = time.monotonic()
        await asyncio.wait_for(watch.lost(), HANG_S)
        assert time.monotonic() - began >= GRACE_S
        assert not watch.connected and watch.disconnects == 0
    watch.close()  # idempotent


async def test_a_dealer_client_with_liveness_watches_its_controller():
    """DealerClient(liveness=(interval, lost_after)) makes its watch before it connects,
    and its peer counts as lost lost_after / 2 after its process died (its connection
    closes at once: the killed case above shows that without racing the PONG timeout)."""
    address = f"tcp://127.0.0.1:{free_local_port()}"
    router = start_router(address)
    client = None
    try:
        client = DealerClient(Codec(b"s" * 32), address, b"agent/1", liveness=(HEARTBEAT_S, 2 * GRACE_S))
        assert client.watch.lost_after_s == GRACE_S
        await until(lambda: client.watch.connected, HANG_S)
        router.kill()
        began = time.monotonic()
        await asyncio.wait_for(client.watch.lost(), HANG_S)
        assert time.monotonic() - began >= GRACE_S
    finally:
        router.kill()
        router.wait()
        if client is not None:
            client.close()
    assert_reaped([router.pid])


async def test_the_grace_must_be_positive(dealer):
    with pytest.raises(ValueError, match="lost_after_s"):
        PeerWatch(dealer, 0)


def test_heartbeats_accept_any_timeout(dealer):
    """The TTL travels in deciseconds in 16 bits: a long timeout is capped, not refused."""
    enable_heartbeats(dealer, 0.5, 7200.0)
    assert dealer.getsockopt(zmq.HEARTBEAT_TTL) == MAX_TTL_MS
    assert dealer.getsockopt(zmq.HEARTBEAT_TIMEOUT) == 7_200_000


def test_the_heartbeat_thread_survives_a_fork_of_its_process():
    """A worker that forks (a subprocess started with fork) runs threading's
    after-fork hook over every thread; the heartbeat thread must not shadow
    Thread._stop, which that hook calls ("'Event' object is not callable")."""
    import subprocess
    import sys
    code = ("import os, sys\n"
            "from dynarl.transport.sockets import HeartbeatThread\n"
            "t = HeartbeatThread(b's' * 32, 'ipc:///nonexistent', b'w', 0.05, lambda: 0.0)\n"
            "t.start()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "t.stop(); t.join()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Exception ignored" not in done.stderr, done.stderr
