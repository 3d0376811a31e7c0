"""The `agent` launcher: ranks on node 0 start locally; ranks on other nodes are
started by that node's agent (launch/agent.py), which reports their exits."""
from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import zmq

from dynarl.core.launcher import Launcher, register_launcher
from dynarl.launch.local import TERM_WAIT_S, LocalLauncher
from dynarl.transport.errors import SpawnError, WorkerLost
from dynarl.transport.rpc import RpcEndpoint

log = logging.getLogger(__name__)
AGENT_CALL_S = 30.0
"""Bound on a node agent's answer to a quick request (a port, a kill, shutdown)."""

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_handle import WorkerHandle


class RemoteWorker:
    def __init__(self, node: int, worker_id: str) -> None:
        self.node = node
        self.worker_id = worker_id


class AgentLauncher(Launcher):
    name = "agent"
    uses_sockets = True
    remote_workers = True
    """Workers on other hosts connect over TCP."""

    def __init__(self, node_host: str = "127.0.0.1") -> None:
        self._local = LocalLauncher()
        self._ctl: "Controller | None" = None
        self.agents: dict[int, RpcEndpoint] = {}
        self._hosts: dict[int, str] = {0: node_host}
        self._arrived = asyncio.Event()
        self._handles: dict[str, "WorkerHandle"] = {}
        self.unreachable: dict[int, asyncio.Event] = {}
        """Nodes whose agent left a call unanswered or whose connection is gone (the event
        is set then): calls in flight to them end at once, and no further call is sent.
        Their agents stop their own workers once they lose the controller (launch/agent.py)."""

    async def start(self, ctl: "Controller") -> None:
        self._ctl = ctl
        await self._local.start(ctl)
        ctl.router.on_unknown = self._on_unknown
        ctl.router.on_disconnect = self._on_disconnect

    def _on_unknown(self, identity: bytes, body: Any) -> None:
        if not identity.startswith(b"agent/") or not isinstance(body, dict) or body.get("e") != "hello":
            return
        data = body.get("d") or {}
        node = int(data["node"])
        endpoint = RpcEndpoint(f"agent{node}", lambda b: self._ctl.router.send(identity, b),
                               on_event=self._on_agent_event, spawn=self._ctl.spawn_task)
        self._ctl.router.routes[identity] = endpoint.handle
        self.agents[node] = endpoint
        self._hosts[node] = str(data.get("host", "127.0.0.1"))
        self._arrived.set()

    def _on_disconnect(self, identity: bytes) -> None:
        """An agent's connection closed: it exited, or its heartbeats went unanswered for
        runtime.heartbeat_timeout_s (its host or the link is down). Calls to it in flight
        end now rather than at their bounds; a send to it would fail from here on."""
        if identity.startswith(b"agent/"):
            node = int(identity.removeprefix(b"agent/"))
            if node in self.agents and not self.is_unreachable(node):
                log.info("the connection to the agent of node %d (%s) closed", node, self.node_address(node))
                self._mark_unreachable(node)

    def _on_agent_event(self, name: str, data: Any) -> None:
        if name == "worker_exit":
            handle = self._handles.pop(data["worker_id"], None)
            if handle is not None:
                node = handle.spec.node
                handle.mark_lost(f"process exited with code {data['code']} on node {node} ({self.node_address(node)})")

    async def wait_for_agents(self, count: int, timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while len(self.agents) < count:
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            raise SpawnError(f"only {len(self.agents)} of {count} node agents connected "
                             f"within {timeout_s} s") from None

    def node_address(self, node: int) -> str:
        return self._hosts.get(node, "127.0.0.1")

    async def free_port(self, node: int) -> int:
        if node == 0:
            return await self._local.free_port(0)
        return await self._ask(node, "free_port", [], AGENT_CALL_S)

    async def spawn(self, handle: "WorkerHandle") -> None:
        node = handle.spec.node
        if node == 0:
            return await self._local.spawn(handle)
        ctl = self._ctl
        ctl.expect(handle)
        self._handles[handle.spec.worker_id] = handle
        handle.process = RemoteWorker(node, handle.spec.worker_id)
        handle.pid = await self._ask(node, "spawn_worker", [handle.spec.to_wire(), ctl.config.heartbeat_interval_s,
                                                            ctl.config.max_message_bytes], ctl.config.spawn_timeout_s)

    async def stop(self, handle: "WorkerHandle", grace_s: float) -> None:
        if isinstance(handle.process, RemoteWorker):
            self._handles.pop(handle.spec.worker_id, None)
            node = handle.process.node
            if not self.is_unreachable(node):
                # a rank lost by its heartbeat may be behind a cut link: its agent too, likely
                # (+ TERM_WAIT_S: the agent's reap waits that long after SIGTERM before SIGKILL)
                bound = self._ctl.config.heartbeat_timeout_s + TERM_WAIT_S if handle.lost is not None else AGENT_CALL_S
                try:
                    await self._ask(node, "stop_worker", [handle.spec.worker_id, grace_s], 2 * grace_s + bound)
                    return
                except WorkerLost:
                    if not self.is_unreachable(node):
                        raise
            log.warning("not stopping %s: the agent of node %d (%s) is unreachable; it stops its workers "
                        "itself once it loses the controller", handle.name, node, self.node_address(node))
        else:
            await self._local.stop(handle, grace_s)

    def kill(self, handle: "WorkerHandle") -> None:
        if isinstance(handle.process, RemoteWorker):
            if self.is_unreachable(handle.process.node):
                return  # (stop's warning says why)
            self._ctl.spawn_task(_quietly(f"kill {handle.name}", self._ask(
                handle.process.node, "stop_worker", [handle.spec.worker_id, 0.0], AGENT_CALL_S)))
        else:
            self._local.kill(handle)

    async def close(self) -> None:
        await self._local.close()
        await asyncio.gather(*(self._ask(node, "shutdown", [], AGENT_CALL_S) for node in self.agents
                               if not self.is_unreachable(node)), return_exceptions=True)

    def is_unreachable(self, node: int) -> bool:
        gone = self.unreachable.get(node)
        return gone is not None and gone.is_set()

    def _mark_unreachable(self, node: int) -> None:
        self.unreachable.setdefault(node, asyncio.Event()).set()

    async def _ask(self, node: int, method: str, args: list, timeout_s: float) -> Any:
        """A call to a node agent, bounded: a frozen or vanished agent is an error, not
        a hang of the controller. A node found unreachable (by this call or another)
        fails its calls at once."""
        where = f"node {node}, {self.node_address(node)}"
        if self.is_unreachable(node):
            raise WorkerLost(f"agent{node}", f"unreachable ({where}): {method} not sent")
        gone = self.unreachable.setdefault(node, asyncio.Event())
        call = asyncio.ensure_future(self._agent(node).call(method, args))
        waiter = asyncio.ensure_future(gone.wait())
        try:
            done, _ = await asyncio.wait([call, waiter], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if call in done:
            try:
                return call.result()
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:  # (EAGAIN: its queue is full, not gone)
                    raise
                self._mark_unreachable(node)
                raise WorkerLost(f"agent{node}", f"unreachable for {method}: {exc} ({where})") from None
        call.cancel()
        if not done:
            self._mark_unreachable(node)
            raise WorkerLost(f"agent{node}", f"no answer to {method} within {timeout_s:.0f} s ({where})")
        raise WorkerLost(f"agent{node}", f"unreachable ({where}): {method} abandoned")

    def _agent(self, node: int) -> RpcEndpoint:
        agent = self.agents.get(node)
        if agent is None:
            raise SpawnError(f"no agent connected for node {node}")
        return agent


register_launcher("agent", AgentLauncher)


async def _quietly(what: str, aw: Any) -> None:
    """For fire-and-forget calls in the controller's TaskGroup: a failure (the agent is
    gone) is logged, not raised, or it would cancel the whole job."""
    try:
        await aw
    except Exception as exc:
        log.warning("%s failed: %r", what, exc)
