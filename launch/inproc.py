"""The `inproc` launcher: ranks are objects in the controller's own event loop.

Same Worker classes, same RpcEndpoint call/reply/error/cancel path as over ZMQ,
but messages are handed over in memory (next loop iteration), without encoding:
arguments are shared, not copied, and so are channel items. This is what the simulator runs thousands of
emulated devices on, inside the virtual-time loop, deterministically.
"""
from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from dynarl.core.launcher import Launcher, register_launcher
from dynarl.core.worker_runtime import WorkerRuntime
from dynarl.transport.errors import WorkerLost
from dynarl.transport.rpc import RpcEndpoint

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_handle import WorkerHandle


class InprocWorker:
    """Stands where a process would: the runtime and its endpoint."""

    def __init__(self, runtime: WorkerRuntime, endpoint: RpcEndpoint) -> None:
        self.runtime = runtime
        self.endpoint = endpoint
        self.killed = False


class InprocLauncher(Launcher):
    name = "inproc"
    uses_sockets = False
    needs_importable_classes = False

    def __init__(self) -> None:
        self._ctl: "Controller | None" = None

    async def start(self, ctl: "Controller") -> None:
        self._ctl = ctl

    async def spawn(self, handle: "WorkerHandle") -> None:
        ctl = self._ctl
        loop = asyncio.get_running_loop()
        endpoints: dict[str, RpcEndpoint] = {}

        def send_now(to: str) -> Any:
            def send(body: dict) -> bool:
                if inproc.killed:
                    raise WorkerLost(handle.name, "killed")
                loop.call_soon(endpoints[to].handle, body)
                return True
            return send

        def courier(to: str) -> Any:
            now = send_now(to)

            async def send(body: dict) -> None:
                now(body)
            return send

        runtime = WorkerRuntime(handle.spec, lambda m, a, kw: endpoints["worker"].call(m, a, kw),
                                ctl.spawn_task, cls=handle.cls, share_items=True, secret=ctl.secret)
        # Plain calls both ways are answered where they arrive, with no task per call
        # (the RPC fast path, as the ZMQ worker has): the worker's plain methods, and
        # the controller's channel operations that need no wait.
        endpoints["worker"] = RpcEndpoint("controller", courier("controller"), serve=runtime.serve,
                                          spawn=ctl.spawn_task, plain_method=runtime.plain_method,
                                          send_now=send_now("controller"))
        endpoints["controller"] = RpcEndpoint(
            handle.name, courier("worker"), serve=lambda m, a, kw: ctl.serve_worker_call(handle, m, a, kw),
            on_event=handle.on_event, spawn=ctl.spawn_task,
            plain_method=ctl.plain_worker_call(handle),
            send_now=send_now("worker"))
        inproc = InprocWorker(runtime, endpoints["worker"])
        handle.process = inproc
        handle.attach(endpoints["controller"], os.getpid())

    async def free_port(self, node: int) -> int:
        return 0  # no torchrun rendezvous between objects in one loop

    async def stop(self, handle: "WorkerHandle", grace_s: float) -> None:
        return None  # nothing to reap

    def kill(self, handle: "WorkerHandle") -> None:
        inproc = handle.process
        if isinstance(inproc, InprocWorker) and not inproc.killed:
            inproc.killed = True
            inproc.endpoint.fail(WorkerLost(handle.name, "killed"))
            handle.mark_lost("killed")


register_launcher("inproc", InprocLauncher)
