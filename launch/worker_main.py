"""Entry point of a worker process: `python -m dynarl.launch.worker_main`.

Reads its bootstrap (controller address, job secret, WorkerSpec) as one JSON line
on stdin, connects to the controller, says hello and serves calls until stopped.
"""
from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import sys
from typing import Callable

import uvloop

from dynarl.core.worker import WorkerSpec
from dynarl.core.worker_runtime import WorkerRuntime
from dynarl.launch.node_host import bind_host_for
from dynarl.transport.data_plane import PayloadFetcher, PayloadServer
from dynarl.transport.rpc import RpcEndpoint
from dynarl.transport.sockets import DealerClient, HeartbeatThread, LoopTicker
from dynarl.transport.wire import Codec

PR_SET_PDEATHSIG = 1
TERM_GRACE_S = 20.0
"""How long a worker or a node agent stays up after SIGTERM. slurm's scancel (and a
job's time limit) signals every process of the job at once; the controller's
ordered stop needs its workers and agents alive meanwhile, and ends them itself.
slurm sends SIGKILL KillWait (30 s by default) after SIGTERM."""


def after_sigterm(loop: asyncio.AbstractEventLoop, expire: Callable[[], None],
                  grace_s: float = TERM_GRACE_S) -> None:
    """SIGTERM no longer ends this process at once: `expire()` runs `grace_s` after the
    first one, unless the process ended before (its controller stopped it)."""
    def on_term() -> None:
        loop.add_signal_handler(signal.SIGTERM, lambda: None)  # later ones change nothing
        loop.call_later(grace_s, expire)
    loop.add_signal_handler(signal.SIGTERM, on_term)


def die_with_parent(parent: int | None = None) -> None:
    """Linux: SIGKILL this process when its parent dies, so a killed controller
    (or node agent) never leaves workers behind. The parent's pid is `parent`, else
    the launcher's (DYNARL_PARENT_PID): one that died during this process's imports,
    before prctl, is seen here as a different parent (init or a subreaper)."""
    # popped: a process this worker starts must not inherit it and see the wrong parent
    launcher = os.environ.pop("DYNARL_PARENT_PID", "")
    parent = parent or int(launcher or os.getppid())
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


async def serve(boot: dict) -> None:
    secret = bytes.fromhex(boot["secret"])
    codec = Codec(secret, max_message_bytes=boot["max_message_bytes"])
    spec = WorkerSpec(**boot["spec"])
    identity = spec.worker_id.encode()
    dealer = DealerClient(codec, boot["address"], identity)
    interval = boot["heartbeat_interval_s"]
    ticker = LoopTicker(interval)
    heartbeat = HeartbeatThread(secret, boot["address"], identity, interval, ticker.lag)
    heartbeat.start()
    # at expiry no teardown runs: the IPC dir is left to the next controller's sweep (tempdirs)
    after_sigterm(asyncio.get_running_loop(), lambda: os._exit(128 + signal.SIGTERM))
    data_host = boot.get("data_host", "127.0.0.1")  # this node's address as peers reach it
    payloads = PayloadServer(codec, bind_host_for(data_host), advertise=data_host)
    fetcher: PayloadFetcher | None = None
    try:
        async with asyncio.TaskGroup() as tg:
            endpoint: RpcEndpoint
            fetcher = PayloadFetcher(codec, tg.create_task)
            runtime = WorkerRuntime(spec, lambda m, a, kw: endpoint.call(m, a, kw), tg.create_task,
                                    payloads=payloads, fetcher=fetcher, secret=secret)
            endpoint = RpcEndpoint("controller", dealer.send, serve=runtime.serve, spawn=tg.create_task,
                                   plain_method=runtime.plain_method, send_now=dealer.send_nowait)
            background = [tg.create_task(dealer.serve(endpoint.handle)), tg.create_task(ticker.run()),
                          tg.create_task(payloads.serve())]
            await endpoint.event("hello", {"pid": os.getpid()})
            await runtime.stopped.wait()
            for _ in range(1000):  # let the __stop__ reply go out
                if endpoint.num_serving == 0:
                    break
                await asyncio.sleep(0.001)
            for task in background:
                task.cancel()
            fetcher.stop()
    finally:
        heartbeat.stop()
        payloads.close()
        if fetcher is not None:
            fetcher.close()
        dealer.close(linger_ms=1000)


def main() -> None:
    die_with_parent()
    boot = json.loads(sys.stdin.readline())
    uvloop.run(serve(boot))


if __name__ == "__main__":
    main()
