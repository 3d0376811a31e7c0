"""RPC between two peers: call / reply / error / event / cancel.

`RpcEndpoint` is one side of a conversation with one peer. It knows nothing about
sockets: it is given an async `send(body)` and fed received bodies through
`handle(body)`, so ZMQ, the in-process launcher and tests all share this code.

Message bodies (msgpack maps):
    {"k": "call",   "id": n, "m": method, "a": [args], "kw": {kwargs}}
    {"k": "reply",  "id": n, "v": value}
    {"k": "error",  "id": n, "type": name, "msg": text, "tb": traceback text}
    {"k": "event",  "e": name, "d": data}
    {"k": "cancel", "id": n}
"""
from __future__ import annotations

import asyncio
import inspect
import itertools
import logging
import traceback
from typing import Any, Awaitable, Callable

from dynarl.transport.errors import RemoteError

log = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]
SendNow = Callable[[dict], bool]
Serve = Callable[[str, list, dict], Awaitable[Any]]
PlainMethod = Callable[[str], Callable[..., Any] | None]
OnEvent = Callable[[str, Any], None]


class RpcEndpoint:
    def __init__(self, peer_name: str, send: Send, *, serve: Serve | None = None,
                 on_event: OnEvent | None = None,
                 spawn: Callable[[Awaitable[Any]], asyncio.Task] | None = None,
                 plain_method: PlainMethod | None = None, send_now: SendNow | None = None) -> None:
        """`plain_method` and `send_now` (both or neither) make the fast path for plain
        (non-async) methods: `plain_method(name)` returns the function to run, or None
        for the usual path, and the call runs and is answered right where it arrived,
        with no task (~a tenth of a round trip here). `send_now(body)` sends without
        waiting and says whether the socket took it."""
        self.peer_name = peer_name
        self._send = send
        self._serve = serve or _serves_no_calls
        self._plain_method = plain_method if send_now is not None else None
        self._send_now = send_now
        self._unstarted: set[int] = set()
        """Served calls spawned but not yet running: while any is, a plain call waits
        its turn as a task too, so calls start in the order they arrived."""
        self._waking = False
        """A reply arrived this turn of the loop and its caller has not resumed yet."""
        self._on_event = on_event
        # Served calls are owned by the caller's TaskGroup when one is given.
        self._spawn = spawn or asyncio.ensure_future
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future, str]] = {}
        self._serving: dict[int, asyncio.Task] = {}
        self.failure: BaseException | None = None
        self.calls_served = 0

    @property
    def num_serving(self) -> int:
        return len(self._serving)

    async def call(self, method: str, args: list | tuple = (), kwargs: dict | None = None) -> Any:
        if self.failure is not None:
            raise self.failure
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[call_id] = (fut, method)
        try:
            await self._send({"k": "call", "id": call_id, "m": method, "a": list(args), "kw": kwargs or {}})
            return await fut
        except asyncio.CancelledError:
            if call_id in self._pending and self.failure is None:
                self._spawn(self._send_quietly({"k": "cancel", "id": call_id}))
            raise
        finally:
            self._pending.pop(call_id, None)

    async def event(self, name: str, data: Any = None) -> None:
        await self._send({"k": "event", "e": name, "d": data})

    def handle(self, body: Any) -> None:
        """Dispatches one received body. A body of the wrong shape is logged and
        dropped; it never breaks the endpoint."""
        kind = body.get("k") if isinstance(body, dict) else None
        if kind in ("reply", "error"):
            entry = self._pending.get(body.get("id"))
            if entry is None:
                return  # the caller gave up (cancelled); nothing to deliver
            fut, method = entry
            if fut.done():
                return
            if kind == "reply":
                fut.set_result(body.get("v"))
            else:
                fut.set_exception(RemoteError(self.peer_name, method, str(body.get("type")),
                                              str(body.get("msg")), str(body.get("tb"))))
            if self._plain_method is not None and not self._waking:
                # the caller resumes on the loop's next turn: plain calls that arrive
                # before then wait behind it, as they would as tasks
                self._waking = True
                asyncio.get_running_loop().call_soon(self._woken)
        elif kind == "call" and isinstance(body.get("m"), str) and isinstance(body.get("id"), int):
            if not self._answered_now(body):
                self._start_task(body["id"], self._run(body), unstarted=True)
        elif kind == "cancel":
            task = self._serving.get(body.get("id"))
            if task is not None:
                task.cancel()
        elif kind == "event" and isinstance(body.get("e"), str):
            if self._on_event is not None:
                self._on_event(body["e"], body.get("d"))
        else:
            log.warning("dropping a message of unknown shape from %s", self.peer_name)

    def fail(self, exc: BaseException) -> None:
        """The peer is gone: every pending and future call raises `exc`."""
        if self.failure is None:
            self.failure = exc
        for fut, _ in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(exc)
        for task in list(self._serving.values()):
            task.cancel()

    # --- serving ------------------------------------------------------------------
    def _answered_now(self, body: dict) -> bool:
        """The fast path: True when the call was for a plain method, run here and
        answered (or handed to a task that finishes it in its turn)."""
        send_now = self._send_now
        if self._plain_method is None or send_now is None or self._unstarted or self._waking:
            return False
        call_id = body["id"]
        try:
            fn = self._plain_method(body["m"])
        except Exception:
            return False  # the task path reports it
        if fn is None:
            return False
        try:
            args, kwargs = _call_arguments(body)
            value = fn(*args, **kwargs)
        except (Exception, asyncio.CancelledError) as exc:
            reply = _error_body(call_id, exc)
        else:
            if inspect.isawaitable(value):  # a plain method that hands back an awaitable
                self._start_task(call_id, self._run(body, value), unstarted=True, awaitable=value)
                return True
            reply = {"k": "reply", "id": call_id, "v": value}
        try:
            if send_now(reply):
                self.calls_served += 1
                return True
        except Exception as exc:  # the value can't go on the wire, or the socket failed
            if reply["k"] == "error":
                log.debug("send to %s failed: %s", self.peer_name, exc)
                self.calls_served += 1
                return True
            reply = _error_body(call_id, exc)
        self._start_task(call_id, self._deliver(reply), unstarted=False)  # the socket is full: wait
        return True

    def _start_task(self, call_id: int, coro: Awaitable[None], *, unstarted: bool,
                    awaitable: Awaitable[Any] | None = None) -> None:
        """Serves a call in a task, counted in num_serving until it is done, even if it
        is cancelled before it starts."""
        if unstarted:
            self._unstarted.add(call_id)
        task = self._spawn(coro)
        self._serving[call_id] = task

        def done(t: asyncio.Task) -> None:
            if self._serving.get(call_id) is t:
                del self._serving[call_id]
            self._unstarted.discard(call_id)
            if inspect.iscoroutine(awaitable):
                awaitable.close()  # (no-op once awaited) cancelled first: never awaited, no warning
        task.add_done_callback(done)

    async def _run(self, body: dict, awaiting: Awaitable[Any] | None = None) -> None:
        """Serves one call and sends its reply. `awaiting`: the value is already on its
        way (a plain method returned an awaitable); only await it."""
        call_id = body["id"]
        self._unstarted.discard(call_id)
        try:
            if awaiting is not None:
                value = await awaiting
            else:
                args, kwargs = _call_arguments(body)
                value = await self._serve(body["m"], args, kwargs)
            reply = {"k": "reply", "id": call_id, "v": value}
        except asyncio.CancelledError:
            return  # the caller cancelled (or we are shutting down): no reply
        except Exception as exc:
            reply = _error_body(call_id, exc)
        await self._deliver(reply)

    async def _deliver(self, reply: dict) -> None:
        """Sends a reply; one that cannot go on the wire becomes the error saying why.
        The task stays in num_serving until this returns, so a worker that waits for
        `num_serving == 0` before exiting delivers it."""
        try:
            await self._send(reply)
        except Exception as exc:
            if reply["k"] == "reply":
                await self._send_quietly(_error_body(reply["id"], exc))
            else:
                log.debug("send to %s failed: %s", self.peer_name, exc)
        finally:
            self.calls_served += 1

    def _woken(self) -> None:
        self._waking = False

    async def _send_quietly(self, body: dict) -> None:
        try:
            await self._send(body)
        except Exception as exc:
            log.debug("send to %s failed: %s", self.peer_name, exc)


async def _serves_no_calls(method: str, args: list, kwargs: dict) -> Any:
    raise PermissionError("this peer serves no calls")


def _call_arguments(body: dict) -> tuple[list, dict]:
    args = body.get("a") or []
    kwargs = body.get("kw") or {}
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError("malformed call arguments")
    return args, kwargs


def _error_body(call_id: int, exc: BaseException) -> dict:
    return {"k": "error", "id": call_id, "type": type(exc).__name__, "msg": str(exc),
            "tb": "".join(traceback.format_exception(exc))}

