"""The controller: one event loop that spawns worker groups, serves channels,
builds process groups at runtime and shuts everything down in order.

    async with Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(MyWorker, num_ranks=2)
        print(await group.call(MyWorker.hello))

Every long-running task (socket receive loop, liveness monitor, served calls,
process watchers) is owned by the controller's TaskGroup. Shutdown is ordered
and best-effort: close channels, stop groups (side by side), reap processes,
stop tasks, close sockets, write the trace. Each step logs its failure and the
next one still runs, so no process is left behind, also on Ctrl-C or when user
code raises.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import Any, Sequence

import zmq

from dynarl.core.config import RuntimeConfig
from dynarl.core.devices import DevicePool
from dynarl.core.device_lock import LockManager
from dynarl.core.health import HealthLimits, State, monitor, rank_health
from dynarl.core.hypergraph import Hypergraph
from dynarl.core.launcher import Launcher, make_launcher
from dynarl.core.process_groups import ProcessGroups, RuntimeProcessGroup
from dynarl.core.script_guard import MainGuardMissing
from dynarl.core.tracing import Tracer
from dynarl.core.worker import Worker, WorkerSpec, rank_specs
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel
from dynarl.core.worker_handle import WorkerHandle
from dynarl.core.channel_service import ChannelService
from dynarl.transport import tempdirs
from dynarl.transport.channel import Channel
from dynarl.transport.data_plane import PayloadFetcher
from dynarl.transport.errors import RemoteError, SpawnError, WorkerLost
from dynarl.transport.rpc import RpcEndpoint
from dynarl.transport.sockets import RouterServer
from dynarl.transport.wire import Codec

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, config: RuntimeConfig | None = None, *, launcher: Launcher | None = None,
                 secret: bytes | None = None) -> None:
        self.config = config or RuntimeConfig()
        c = self.config
        self.health_limits = HealthLimits.of(c.heartbeat_interval_s, c.heartbeat_timeout_s, c.hang_timeout_s)
        # Per-job secret: generated here, or handed in out-of-band (node agents).
        self.secret = secret or secrets.token_bytes(32)
        self.codec = Codec(self.secret, max_message_bytes=self.config.max_message_bytes)
        self.pool = DevicePool(self.config.cluster)
        self.locks = LockManager()
        self.tracer = Tracer()
        self.launcher = launcher or make_launcher(self.config.launcher)
        self.groups: dict[str, WorkerGroup] = {}
        self.channels: dict[str, Channel] = {}
        self.process_groups = ProcessGroups(self)
        self.graph = Hypergraph()
        """Runtime half of the hypergraph; `refresh_graph()` folds in channel traffic."""
        self.router: RouterServer | None = None
        self.channel_service = ChannelService(self.channels)
        self._tg = asyncio.TaskGroup()
        self._background: list[asyncio.Task] = []
        self._closed = False
        self._shutdown: asyncio.Future | None = None
        self._starting: set[WorkerHandle] = set()
        """Ranks being started (not in their group yet): watched for liveness too."""
        self._pids: set[int] = set()
        """Every worker process started: their temp dirs are swept at exit (tempdirs)."""
        self.swept: list[str] = []
        """Temp dirs of dead processes removed at start."""

    # --- lifecycle ---------------------------------------------------------------
    async def __aenter__(self) -> "Controller":
        await self._tg.__aenter__()
        try:
            with contextlib.suppress(OSError):  # the dead's temp dirs: never a reason not to start
                self.swept = tempdirs.sweep()
            for path in self.swept:
                log.info("removed %s: its owner process is gone", path)
            if getattr(self.launcher, "uses_sockets", True):
                # TCP only where workers on other hosts need it: a local job's workers
                # use the 0700 IPC socket, and a TCP port would let any local user in
                # (to be refused, but after the loop has read their bytes).
                remote = getattr(self.launcher, "remote_workers", True)
                bind = f"tcp://{self.config.bind_host}:0" if remote else None
                router = self.router = RouterServer(self.codec, bind)
                self._background.append(self._tg.create_task(router.serve(), name="router"))
                self._background.append(self._tg.create_task(monitor(
                    self._watched, router.last_seen, self.health_limits, self.config.heartbeat_interval_s, self.where),
                    name="liveness"))
                self.channel_service.fetcher = PayloadFetcher(self.codec, self.spawn_task)
            await self.launcher.start(self)
        except BaseException as exc:
            await self.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        cancelled: BaseException | None = None
        try:
            await self.shutdown()
        except asyncio.CancelledError as again:  # cancelled during shutdown: still close everything
            cancelled = again
        for task in self._background:
            task.cancel()
        if self.channel_service.fetcher is not None:
            self.channel_service.fetcher.stop()
        try:
            await self._tg.__aexit__(None, None, None)
        except BaseException as group_exc:  # a background task failed
            if exc is None:
                raise
            log.error("background failure during shutdown: %r", group_exc)
        finally:
            if self.channel_service.fetcher is not None:
                self.channel_service.fetcher.close()
            if self.router is not None:
                self.router.close()
            with contextlib.suppress(OSError):  # a worker killed after its grace could not remove its own
                tempdirs.sweep(owners=self._pids)
            if self.config.trace_path:
                try:
                    self.tracer.write(self.config.trace_path)
                except OSError as write_exc:  # the trace must never hide how the run ended
                    log.error("trace not written to %s: %s", self.config.trace_path, write_exc)
        if cancelled is not None:
            raise cancelled
        return False

    async def shutdown(self) -> None:
        """Closes the channels and stops every group (side by side). It runs to the end
        even if its caller is cancelled meanwhile (a second Ctrl-C, an outer TaskGroup):
        the workers are stopped either way (each stop is bounded by the grace period
        and a kill), and the cancellation is raised once they are."""
        self._closed = True
        if self._shutdown is None:
            self._shutdown = asyncio.ensure_future(self._shut_down())
        cancelled = False
        while not self._shutdown.done():
            try:
                await asyncio.shield(self._shutdown)
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError()
        self._shutdown.result()

    async def _shut_down(self) -> None:
        for channel in self.channels.values():
            channel.close()
        # All groups at once: each stop is bounded by the grace period, so the shutdown
        # takes one grace period, not one per group; and ranks that share a process
        # group (a trainer and its standby) leave it together instead of one waiting
        # on a peer that has not been asked to stop yet.
        await asyncio.gather(*(_best_effort(f"stop group {group.name}", self.stop_group(group))
                               for group in list(self.groups.values())))
        await _best_effort("close launcher", self.launcher.close())

    def spawn_task(self, coro: Any, name: str | None = None) -> asyncio.Task:
        """Starts a task owned by the controller's TaskGroup."""
        return self._tg.create_task(coro, name=name)

    # --- groups -----------------------------------------------------------------
    async def spawn(self, cls: type[Worker], *, name: str | None = None, num_ranks: int | None = None,
                    devices: list[int] | None = None, init: dict[str, Any] | None = None,
                    threads: int | None = None) -> WorkerGroup:
        """Starts `cls` on `num_ranks` devices (least loaded first) or on the given
        device ids (one rank each; groups may share devices). Waits until every
        rank has run `__init__` and `setup()`. `threads`: each rank's torch threads,
        its later ranks' too (default: the config's worker_threads, or 1)."""
        if not (isinstance(cls, type) and issubclass(cls, Worker)):
            raise TypeError(f"{cls!r} is not a Worker subclass")
        if self._closed:
            raise RuntimeError("controller is shut down")
        name = name or _unique(cls.__name__.lower(), self.groups)
        if name in self.groups:
            raise ValueError(f"a group named {name!r} already exists")
        device_ids = self.pool.place(name, num_ranks, devices)
        group = WorkerGroup(self, name, cls, [], threads or self.config.worker_threads or 1)
        self.groups[name] = group
        try:
            group.handles = await self._start_ranks(group, device_ids, init or {}, first_rank=0)
        except BaseException:
            self.groups.pop(name, None)
            self.pool.release(name)
            raise
        self.graph.observe_spawn(name, cls.__name__, [h.spec.worker_id for h in group.handles], device_ids)
        return group

    async def grow_group(self, group: WorkerGroup, devices: list[int], init: dict[str, Any] | None = None) -> None:
        """Adds ranks of the group's class on `devices` (a Workload migration's
        receiving side). New ranks continue the rank numbering."""
        ids = self.pool.extend(group.name, devices)
        first = 1 + max((h.spec.rank for h in group.handles), default=-1)
        try:
            group.handles.extend(await self._start_ranks(group, ids, init or {}, first_rank=first))
        except BaseException:
            self.pool.shrink(group.name, ids)
            raise
        self.graph.observe_spawn(group.name, group.cls.__name__, [h.spec.worker_id for h in group.handles],
                                 group.devices)

    async def shrink_group(self, group: WorkerGroup, positions: Sequence[int]) -> list[int]:
        """Stops the ranks at `positions` (indexes into group.handles) and frees their
        devices; the group goes on with the rest. Returns the freed device ids."""
        chosen = [group.handles[p] for p in sorted(set(positions))]
        if len(chosen) >= len(group.handles):
            raise ValueError("shrink_group would leave the group empty; use stop_group")
        await self._stop_handles(chosen)
        group.handles = [h for h in group.handles if h not in chosen]
        freed = [d for h in chosen for d in h.spec.devices]
        self.pool.shrink(group.name, freed)
        self.graph.observe_spawn(group.name, group.cls.__name__, [h.spec.worker_id for h in group.handles],
                                 group.devices)
        return freed

    async def _start_ranks(self, group: WorkerGroup, device_ids: list[int], init: dict,
                           first_rank: int) -> list[WorkerHandle]:
        name, specs = group.name, await self._make_specs(group, device_ids, init, first_rank)
        handles = [WorkerHandle(spec, self.tracer) for spec in specs]
        for h in handles:
            h.cls = group.cls
        loop = asyncio.get_running_loop()
        started = loop.time()
        self._starting.update(handles)  # a setup() that blocks its loop or dies is reported
        try:
            async with asyncio.timeout(self.config.spawn_timeout_s):
                try:
                    await gather_or_cancel([self.launcher.spawn(h) for h in handles])
                finally:
                    self._pids.update(h.pid for h in handles if h.pid)
                await gather_or_cancel([_connected(h) for h in handles])
            await gather_or_cancel([h.send("__start__") for h in handles])
        except BaseException as exc:
            await _best_effort(f"clean up ranks of {name}", self._stop_handles(handles))
            if isinstance(exc, TimeoutError):
                raise SpawnError(f"group {name!r} did not come up within {self.config.spawn_timeout_s} s") from None
            if isinstance(exc, RemoteError) and exc.type_name == "MainGuardMissing":
                raise MainGuardMissing(exc.remote_message) from None  # the fix is in the script, not the worker
            raise
        finally:
            self._starting.difference_update(handles)
        self.tracer.complete("spawn", "lifecycle", name, 0, started, loop.time(), {"ranks": len(handles)})
        return handles

    async def stop_group(self, group: WorkerGroup) -> None:
        """Asks each rank to tear down, then has the launcher reap it (SIGTERM to
        its process group, then SIGKILL, after the grace period)."""
        if group.stopped:
            return
        group.stopped = True
        await self._stop_handles(group.handles)
        self.pool.release(group.name)
        self.groups.pop(group.name, None)
        self.graph.observe_stop(group.name)
        self.tracer.instant("stopped", "lifecycle", group.name, asyncio.get_running_loop().time())

    async def _stop_handles(self, handles: Sequence[WorkerHandle]) -> None:
        grace = self.config.shutdown_grace_s
        live = [h for h in handles if h.alive and h.endpoint is not None]
        for h in live:
            h.stopping = True
        if live:
            await _best_effort("stop ranks", asyncio.wait_for(
                asyncio.gather(*(h.send("__stop__") for h in live), return_exceptions=True), grace))
        # A rank that was lost or never connected gets no grace: it won't exit by itself;
        # nor one that went silent or exited while asked (its endpoint failed meanwhile).
        await asyncio.gather(*(_best_effort(f"reap {h.name}", self.launcher.stop(
            h, grace if h in live and h.endpoint is not None and h.endpoint.failure is None else 0.0))
            for h in handles))
        for h in handles:
            h.mark_stopped()
            if self.router is not None:
                self.router.routes.pop(h.spec.worker_id.encode(), None)

    async def _make_specs(self, group: WorkerGroup, device_ids: list[int], init: dict,
                          first_rank: int) -> list[WorkerSpec]:
        cls, module = group.cls, group.cls.__module__
        if "<locals>" in cls.__qualname__ and getattr(self.launcher, "needs_importable_classes", True):
            raise TypeError(f"{cls.__qualname__} is defined inside a function; worker processes import "
                            "classes by name, so define it at module level")
        main_file = None
        if module == "__main__":
            import __main__
            main_file = getattr(__main__, "__file__", None)
        node0 = self.pool.devices[device_ids[0]].node
        port = await self.launcher.free_port(node0)
        return rank_specs(group.name, f"{module}:{cls.__qualname__}", [self.pool.devices[d] for d in device_ids],
                          first_rank=first_rank, main_file=main_file, init=init,
                          master_addr=self.launcher.node_address(node0), master_port=port,
                          threads=group.threads)

    # --- wiring workers that connect over the router --------------------------------
    def expect(self, handle: WorkerHandle) -> None:
        """Routes messages from `handle`'s identity; its hello attaches an endpoint."""
        identity = handle.spec.worker_id.encode()
        router = self.router
        assert router is not None, "only a launcher that uses sockets expects workers"

        def on_message(body: Any) -> None:
            if handle.endpoint is not None:
                handle.endpoint.handle(body)
            elif isinstance(body, dict) and body.get("k") == "event" and body.get("e") == "hello":
                async def send(b: Any) -> None:
                    try:
                        await router.send(identity, b)
                    except zmq.ZMQError as exc:  # (ROUTER_MANDATORY) the peer is gone
                        handle.mark_lost(f"unreachable: {exc}")
                        raise handle.lost or WorkerLost(handle.name, str(exc)) from None

                def send_now(b: Any) -> bool:
                    try:
                        return router.send_nowait(identity, b)
                    except zmq.ZMQError as exc:
                        handle.mark_lost(f"unreachable: {exc}")
                        raise handle.lost or WorkerLost(handle.name, str(exc)) from None

                # channel operations that need no wait are answered where they arrive (no task)
                endpoint = RpcEndpoint(handle.name, send,
                                       serve=lambda m, a, kw: self.serve_worker_call(handle, m, a, kw),
                                       on_event=handle.on_event, spawn=self.spawn_task,
                                       plain_method=self.plain_worker_call(handle), send_now=send_now)
                handle.attach(endpoint, int((body.get("d") or {}).get("pid", 0)) or None)
        router.routes[identity] = on_message

    def _watched(self) -> list[WorkerHandle]:
        """The ranks the liveness monitor looks at: every group's, and those being started."""
        return [h for group in list(self.groups.values()) for h in group.handles] + list(self._starting)

    def fleet(self, weights: int | None = None) -> dict[str, State]:
        """Every rank's health now (core/health.py), by name; `weights`: the version the
        step needs (ranks holding an older one are stale)."""
        return {h.name: rank_health(gone=not h.alive, silent_s=h.silent_s, loop_lag_s=h.loop_lag_s,
                                    limits=self.health_limits, weights=h.weight_version, current=weights)
                for group in list(self.groups.values()) for h in group.handles if not h.stopped}

    def where(self, handle: WorkerHandle) -> str:
        """' from node N (its address)' in a job of several nodes, else ''."""
        if self.config.cluster.num_nodes == 1:
            return ""
        node = handle.spec.node
        return f" from node {node} ({self.launcher.node_address(node)})"

    # --- channels -----------------------------------------------------------------
    def channel(self, name: str, capacity: int | None = None) -> Channel:
        """The channel `name`, created on first use (capacity: 1024 unless given): `await
        put(item, key=None, weight=1.0)`, `await get(key=None)`, `get_batch`, `close()`
        (transport/channel.py; docs/architecture.md, "Channels and records")."""
        return self.channel_service.channel(name, capacity)

    def refresh_graph(self) -> Hypergraph:
        """Folds every channel's producers and consumers into the hypergraph."""
        for channel in self.channels.values():
            stats = channel.statistics()
            self.graph.observe_channel(channel.name, stats.producers, stats.served_weight, stats.puts, stats.gets,
                                       stats.size)
        return self.graph

    async def serve_worker_call(self, handle: WorkerHandle, method: str, args: list, kwargs: dict) -> Any:
        return await self.channel_service.serve(handle, method, args)

    def plain_worker_call(self, handle: WorkerHandle) -> Any:
        """The RPC fast path's lookup for `handle`'s calls: each is answered at once, or
        hands back the awaitable that answers it (channel_service.serve_now)."""
        return lambda method: lambda *args: self.channel_service.serve_now(handle, method, list(args))

    # --- process groups --------------------------------------------------------------
    async def process_group(self, name: str, members: Sequence[WorkerGroup | tuple[WorkerGroup, int]],
                            *, backend: str | None = None, timeout_s: float = 60.0) -> RuntimeProcessGroup:
        """Builds (or rebuilds, with a new member set) the torch.distributed group
        `name` over the given ranks, in that order."""
        return await self.process_groups.create(name, members, backend=backend, timeout_s=timeout_s)


async def _connected(handle: WorkerHandle) -> None:
    await handle.connected


async def _best_effort(what: str, aw: Any) -> None:
    try:
        await aw
    except Exception as exc:
        log.warning("shutdown step %r failed: %r", what, exc)


def _unique(base: str, taken: dict) -> str:
    if base not in taken:
        return base
    i = 1
    while f"{base}{i}" in taken:
        i += 1
    return f"{base}{i}"
