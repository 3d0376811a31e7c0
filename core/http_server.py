"""An ASGI app served over HTTP as a task on the running loop (asyncio or uvloop): the
one way the job serves HTTP (the agent endpoint, components/agents/server.py; the run's
dashboard, launch/dashboard/server.py).

uvicorn on a socket bound here, so a port in use raises OSError from start() (uvicorn
would sys.exit inside its task), and on a port of 0 `port` is the one the kernel chose.
The process's signals are left alone: dynarl's controller owns SIGINT/SIGTERM, so
uvicorn's capture_signals (which replaces their handlers while serve() runs and re-raises
a caught one after) is a no-op here. No access log, no lifespan, no logging configuration.

Tokens are compared in constant time (`token_matches`): a request's token is its only
guard, and a comparison that stops at the first differing byte tells how much of it matched.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn


class _Uvicorn(uvicorn.Server):
    """uvicorn's Server that leaves signal handlers alone and says when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the host process owns SIGINT/SIGTERM
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


class LoopServer:
    """`app` served on the running loop between start() and stop()."""

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, name: str = "http",
                 grace_s: float = 5.0, max_connections: int = 1024) -> None:
        """grace_s: how long stop() waits for requests under way before cancelling them;
        max_connections: open connections beyond it are answered 503."""
        self.app, self.host, self.port, self.name = app, host, port, name
        self.grace_s, self.max_connections = grace_s, max_connections
        self.socket: socket.socket | None = None
        """The bound socket while serving (closed by stop())."""
        self._server: _Uvicorn | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Binds only `host` (self.port becomes the bound port) and serves as a task on this loop."""
        if self._task is not None:
            raise RuntimeError(f"the {self.name} server is already started")
        loop = asyncio.get_running_loop()
        family, kind, proto, _, address = (await loop.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)  # asyncio's create_server makes it non-blocking
        except BaseException:
            sock.close()
            raise
        self.socket, self.port = sock, sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, host=self.host, port=self.port, http="h11", ws="none", lifespan="off",
            log_config=None, access_log=False, proxy_headers=False, server_header=False,
            timeout_graceful_shutdown=self.grace_s,  # type: ignore[arg-type]
            limit_concurrency=self.max_connections)
        self._server = _Uvicorn(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"{self.name}:{self.port}")
        ready = asyncio.create_task(self._server.ready.wait())
        try:
            await asyncio.wait({self._task, ready}, return_when=asyncio.FIRST_COMPLETED)
            if not ready.done():  # serve() ended before it listened: raise its error
                self._task.result()
                raise RuntimeError(f"the {self.name} server stopped before it listened")
        except BaseException:
            ready.cancel()
            with contextlib.suppress(Exception):
                await self.stop()
            raise

    async def stop(self) -> None:
        """Stops listening, lets requests under way finish (grace_s, then cancels them),
        closes every connection and the socket. Idempotent."""
        task, server, sock = self._task, self._server, self.socket
        self._task = self._server = None
        if task is None or server is None or sock is None:
            return
        server.should_exit = True
        try:
            await task
        finally:
            # past grace_s uvicorn cancels the requests' tasks without waiting for them
            state = server.server_state
            await asyncio.gather(*state.tasks, return_exceptions=True)
            for connection in list(state.connections):
                connection.transport.close()
            sock.close()

    def url(self, path: str = "/") -> str:
        """http://host:port/path (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or "localhost"): reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def token_matches(given: str, token: bytes) -> bool:
    """`given` equals `token`, compared in constant time (text outside latin-1 never does)."""
    try:
        return hmac.compare_digest(given.encode("latin-1"), token)
    except UnicodeEncodeError:
        return False
