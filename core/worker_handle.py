"""The controller's view of one rank: its RPC endpoint, liveness and process."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, overload

from dynarl.core.remote import AsyncMethod, P, R, SyncMethod, method_name
from dynarl.core.worker import WorkerSpec
from dynarl.transport.errors import WorkerLost
from dynarl.transport.rpc import RpcEndpoint

if TYPE_CHECKING:
    from dynarl.core.tracing import Tracer


class WorkerHandle:
    def __init__(self, spec: WorkerSpec, tracer: "Tracer") -> None:
        self.spec = spec
        self.name = f"{spec.group}[{spec.rank}]"
        self.endpoint: RpcEndpoint | None = None
        self.pid: int | None = None
        self.process: Any = None
        """Launcher-specific process object."""
        self.cls: type | None = None
        """The Worker class itself (the inproc launcher needs no import by name)."""
        self.lost: WorkerLost | None = None
        self.stopping = False
        """A graceful stop is under way: an exit is expected, not a loss."""
        self.stopped = False
        self.loop_lag_s = 0.0
        self.silent_s = 0.0
        """Seconds since the controller last heard from it (the monitor's last look)."""
        self.weight_version: int | None = None
        """The policy weights it holds, where they apply (set by the workflow's sync)."""
        self.connected: asyncio.Future = asyncio.get_running_loop().create_future()
        self._tracer = tracer

    @property
    def alive(self) -> bool:
        return self.lost is None and not self.stopped

    def attach(self, endpoint: RpcEndpoint, pid: int | None) -> None:
        """The worker is reachable: its hello arrived (or, inproc, it was built)."""
        self.endpoint = endpoint
        self.pid = pid
        if not self.connected.done():
            self.connected.set_result(None)

    def on_event(self, name: str, data: Any) -> None:
        if name == "heartbeat" and isinstance(data, dict):
            self.loop_lag_s = float(data.get("lag", 0.0))

    @overload
    async def call(self, method: AsyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

    @overload
    async def call(self, method: SyncMethod[P, R], *args: P.args, **kwargs: P.kwargs) -> R: ...

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`method` (a reference: core/remote.py) on this rank."""
        return await self.send(method_name(method, self.cls), args, kwargs)

    async def send(self, method: str, args: list | tuple = (), kwargs: dict | None = None) -> Any:
        """The call as it goes on the wire, by name: `call`'s, and the worker runtime's
        own verbs (core/worker_runtime.py: __start__, __stop__, __pg_join__, ...)."""
        if self.lost is not None:
            raise self.lost
        if self.endpoint is None:
            raise WorkerLost(self.name, "not connected")
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            return await self.endpoint.call(method, args, kwargs)
        finally:
            self._tracer.complete(method, "rpc", self.spec.group, self.spec.rank, start, loop.time())

    def mark_lost(self, reason: str) -> None:
        if self.lost is not None or self.stopped:
            return
        if self.stopping:
            # an exit while stopping is no loss; but its stop call ends now (a rank behind
            # a cut link would otherwise hold the shutdown for the whole grace period)
            if self.endpoint is not None:
                self.endpoint.fail(WorkerLost(self.name, reason))
            return
        self.lost = WorkerLost(self.name, reason)
        if self.endpoint is not None:
            self.endpoint.fail(self.lost)
        if not self.connected.done():
            self.connected.set_exception(self.lost)
            self.connected.exception()  # mark retrieved: spawn may already have given up

    def mark_stopped(self) -> None:
        self.stopped = True
        if self.endpoint is not None:
            self.endpoint.fail(WorkerLost(self.name, "stopped"))
