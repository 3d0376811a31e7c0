"""Serves one Worker instance: the worker-process side of the RPC.

The same class runs inside a worker process (local and agent launchers) and
inside the controller's loop (inproc launcher), which is what gives the two the
same call semantics.
"""
from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import types
from typing import Any, Awaitable, Callable

from dynarl.core.script_guard import importing
from dynarl.core.worker import Worker, WorkerSpec
from dynarl.transport.channel_client import ChannelClient
from dynarl.transport.data_plane import PayloadFetcher, PayloadLost, PayloadServer
from dynarl.transport.process_group import GroupMembership, host_store, join_group, leave_group
from dynarl.transport.wire import RemoteRef, decode_blob, encode_blob

Call = Callable[[str, list, dict], Awaitable[Any]]
log = logging.getLogger(__name__)
_UNSEEN = object()


class WorkerRuntime:
    def __init__(self, spec: WorkerSpec, call_controller: Call,
                 spawn: Callable[[Awaitable[Any]], asyncio.Task], cls: type[Worker] | None = None,
                 payloads: PayloadServer | None = None, fetcher: PayloadFetcher | None = None,
                 share_items: bool = False, secret: bytes | None = None) -> None:
        """`share_items`: channel items are not encoded (ranks in the controller's own
        loop and memory: the inproc launcher). `secret`: the job secret, which seals
        the stores of the process groups this rank joins (none: it joins none)."""
        self.spec = spec
        self._secret = secret
        self._share_items = share_items
        self._cls = cls
        self._payloads = payloads
        self._fetcher = fetcher
        self.worker: Worker | None = None
        self.stopped = asyncio.Event()
        self._call_controller = call_controller
        self._spawn = spawn
        self._channels: dict[str, ChannelClient] = {}
        self._groups: dict[str, GroupMembership] = {}
        self._hosted_stores: dict[str, Any] = {}
        self._plain: dict[tuple[type, str], Any] = {}
        self._builtins: dict[str, Callable[..., Awaitable[Any]]] = {
            "__start__": self._start, "__stop__": self._stop, "__ping__": self._ping,
            "__pg_listen__": self._pg_listen, "__pg_join__": self._pg_join, "__pg_leave__": self._pg_leave,
        }

    async def serve(self, method: str, args: list, kwargs: dict) -> Any:
        builtin = self._builtins.get(method)
        if builtin is not None:
            return await builtin(*args, **kwargs)
        if self.worker is None:
            raise RuntimeError("worker not started")
        if method.startswith("_"):
            raise AttributeError(f"{method!r} is private and cannot be called remotely")
        fn = getattr(self.worker, method, None)
        if fn is None or not callable(fn):
            raise AttributeError(f"{type(self.worker).__name__} has no method {method!r}")
        result = fn(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def plain_method(self, method: str) -> Callable[..., Any] | None:
        """The worker's method `method`, bound, when its class defines it as a plain
        (non-async) public function, for the RPC fast path. Anything else (properties,
        instance attributes, async methods, unknown names) is None: the call goes
        down serve(), which also reports the errors. Looked up without running any
        descriptor, and remembered per class."""
        worker = self.worker
        if worker is None or method.startswith("_") or method in getattr(worker, "__dict__", ()):
            return None
        key = (type(worker), method)
        fn = self._plain.get(key, _UNSEEN)
        if fn is _UNSEEN:
            attr = inspect.getattr_static(type(worker), method, None)
            plain = isinstance(attr, types.FunctionType) and not inspect.iscoroutinefunction(attr)
            fn = self._plain[key] = attr if plain else None
        return None if fn is None else fn.__get__(worker)

    # --- services for the Worker ----------------------------------------------
    def offer(self, value: Any) -> RemoteRef | None:
        """Keeps `value` here for a peer rank to fetch straight from this process
        (data_plane.py); None where there is no data plane (in-process ranks)."""
        if self._payloads is None:
            return None
        return self._payloads.offer(encode_blob(value))

    def withdraw(self, ref: RemoteRef) -> None:
        if self._payloads is not None:
            self._payloads.withdraw(ref)

    async def fetch(self, ref: RemoteRef) -> Any:
        """A peer's offer, and tells that peer it may drop it. Raises PayloadLost."""
        if self._fetcher is None:
            raise PayloadLost(f"no data plane here to fetch {ref}")
        blob = await self._fetcher.fetch(ref)
        await self._fetcher.release(ref)
        return decode_blob(blob)

    def channel(self, name: str, *, prefetch: int, window: int) -> ChannelClient:
        client = self._channels.get(name)
        if client is None:
            client = ChannelClient(name, self._call_controller, prefetch=prefetch, window=window,
                                   spawn=self._spawn, payloads=self._payloads, fetcher=self._fetcher,
                                   share_items=self._share_items)
            self._channels[name] = client
        return client

    def process_group(self, name: str) -> Any:
        membership = self._groups.get(name)
        if membership is None:
            raise KeyError(f"this rank is not in a process group named {name!r}")
        return membership.group

    # --- built-in methods ----------------------------------------------------------
    async def _start(self) -> dict:
        cls = self._cls or import_worker_class(self.spec.cls_path, self.spec.main_file)
        worker = cls.__new__(cls)
        worker._bind(self)
        cls.__init__(worker, **self.spec.init())
        self.worker = worker
        await worker.setup()
        return {"pid": os.getpid()}

    async def _stop(self) -> None:
        """Ordered, and each step runs even if one before it failed (the first error is
        raised at the end): the channels get what this rank put (past their capacity
        if need be) and back what it took but did not use; the worker's teardown; what
        it put during teardown; its unfetched peer-to-peer payloads to the controller."""
        errors: list[BaseException] = []

        async def step(coro: Awaitable[Any]) -> None:
            try:
                await coro
            except Exception as exc:
                errors.append(exc)
                log.warning("stopping %s: %r", self.spec.worker_id, exc)

        try:
            for client in self._channels.values():
                await step(client.flush(force=True))
                await step(client.give_back())
            if self.worker is not None:
                await step(self.worker.teardown())
            for client in self._channels.values():
                await step(client.flush(force=True))
            await step(self._rehome_payloads())
            if errors:
                raise errors[0]
        finally:
            for name in list(self._groups):
                await self._pg_leave(name)
            self._hosted_stores.clear()
            self.stopped.set()

    async def _rehome_payloads(self) -> None:
        """Payloads offered peer-to-peer but not fetched yet would die with this
        process: hand them to the controller, which keeps them for their consumer."""
        if self._payloads is None:
            return
        for ref, blob, served in self._payloads.take_all():
            await self._call_controller("__payload__", ["rehome", ref.address, ref.id, blob, served], {})

    async def _ping(self) -> int:
        return os.getpid()

    async def _pg_listen(self, name: str, host: str) -> int:
        store = await asyncio.to_thread(host_store, host)
        self._hosted_stores[name] = store
        return store.port

    async def _pg_join(self, name: str, prefix: str, rank: int, size: int, host: str, port: int,
                       backend: str, timeout_s: float, own_host: str,
                       devices: list[int | None] | None = None) -> None:
        if name in self._groups:
            await self._pg_leave(name)
        if backend == "emulated":  # membership only: nothing blocks
            self._groups[name] = join_group(name, prefix, rank, size, host, port, backend, timeout_s,
                                            secret=b"")
            return
        if self._secret is None:
            raise RuntimeError(f"process group {name!r}: this rank has no job secret to seal the group's store")
        store = self._hosted_stores.get(name) if rank == 0 else None
        self._groups[name] = await asyncio.to_thread(functools.partial(
            join_group, name, prefix, rank, size, host, port, backend, timeout_s, store, own_host, devices,
            secret=self._secret))

    async def _pg_leave(self, name: str) -> None:
        membership = self._groups.pop(name, None)
        if membership is not None and membership.store is not None:
            await asyncio.to_thread(leave_group, membership)
        self._hosted_stores.pop(name, None)


def import_worker_class(cls_path: str, main_file: str | None) -> type[Worker]:
    module_name, _, qualname = cls_path.partition(":")
    if module_name == "__main__" and main_file:
        # The user's script, loaded under another name so its `if __name__ ==
        # "__main__"` block does not run again in the worker.
        module = sys.modules.get("__dynarl_main__")
        if module is None:
            spec = importlib.util.spec_from_file_location("__dynarl_main__", main_file)
            if spec is None or spec.loader is None:
                raise ImportError(f"{main_file} cannot be loaded as a module")
            module = importlib.util.module_from_spec(spec)
            sys.modules["__dynarl_main__"] = module
            try:
                with importing(main_file):  # the job-starting code belongs under the guard
                    spec.loader.exec_module(module)
            except BaseException:
                del sys.modules["__dynarl_main__"]  # not a half-run script for the next rank
                raise
    else:
        module = importlib.import_module(module_name)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, Worker)):
        raise TypeError(f"{cls_path} is not a Worker subclass")
    return obj
