"""The agent endpoint's HTTP layer: an OpenAI-compatible server (starlette on uvicorn) that
an unmodified agent, written with the `openai` package, calls at base_url(session).

  POST /sessions/{sid}/v1/chat/completions   -> Backend.chat(sid, ChatRequest)
  POST /sessions/{sid}/v1/completions        -> Backend.complete(sid, CompletionRequest)
  GET  /sessions/{sid}/v1/models             -> the one model name

It runs as a task on the caller's running loop (asyncio or uvloop), as core/http_server.py
serves an app: the process's signals left alone (dynarl's controller owns SIGINT/SIGTERM),
its socket bound there, so a port in use raises OSError from start(). No access log, no
lifespan, no logging configuration.

Every request needs `Authorization: Bearer <token>`. A body is bounded before it is held:
a Content-Length over max_body_bytes is refused unread, a chunked body is read piece by
piece and refused once it passes the bound; a refused request's connection is closed (its
body may still be on the wire). Every refusal is OpenAI's error JSON and counted in
`counters`; a backend exception that is not one of messages.py's is logged, answered 500
"internal error" (no traceback) and the server goes on serving."""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import secrets
import socket
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from dynarl.components.agents.messages import (
    BadRequest, ChatRequest, CompletionRequest, SessionBusy, TurnOutput, UnknownSession)
from dynarl.components.agents.openai_requests import (
    parse_chat_request, parse_completion_request)
from dynarl.components.agents.openai_responses import (
    chat_chunks, chat_completion, completion_chunks, dumps, error_body, model_list, sse,
    text_completion)
from dynarl.core.http_server import LoopServer, is_loopback, token_matches

log = logging.getLogger(__name__)
_SESSION_ID = re.compile(r"[A-Za-z0-9._~-]+")


class Backend(Protocol):
    """The sessions behind the endpoint: one model turn per call. Raises BadRequest (400),
    UnknownSession (404) or SessionBusy (409) for the client; anything else is a 500."""

    async def chat(self, session: str, request: ChatRequest) -> TurnOutput: ...

    async def complete(self, session: str, request: CompletionRequest) -> TurnOutput: ...


class _Refusal(Exception):
    """A request answered with an error: its status, the counter it counts in, and
    whether the connection closes (the body was left unread)."""

    def __init__(self, status: int, counter: str, message: str, *,
                 type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None, close: bool = False) -> None:
        super().__init__(message)
        self.status, self.counter, self.type = status, counter, type
        self.code, self.param, self.close = code, param, close


class AgentServer:
    """The endpoint, served on the running loop between start() and stop()."""

    def __init__(self, backend: Backend, token: str, *, host: str = "127.0.0.1",
                 port: int = 0, max_body_bytes: int = 1 << 20, model: str = "dynarl",
                 grace_s: float = 5.0, max_connections: int = 1024, read_timeout_s: float = 60.0) -> None:
        """grace_s: how long stop() waits for requests under way before cancelling them;
        max_connections: open connections beyond it are answered 503; read_timeout_s: a
        request body not in by then is refused (408)."""
        if not token:
            raise ValueError("token must not be empty (it is the endpoint's only guard)")
        self.backend, self.host, self.port = backend, host, port
        self.max_body_bytes, self.model, self.grace_s = max_body_bytes, model, grace_s
        self.max_connections, self.read_timeout_s = max_connections, read_timeout_s
        if not is_loopback(host):
            log.warning("the agent endpoint binds %s, not loopback: its bearer token travels in plain HTTP; "
                        "bind the job's own network only", host)
        self._token = token.encode()
        self.counters: collections.Counter[str] = collections.Counter()
        self.app = Starlette(routes=[
            Route("/sessions/{sid}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/sessions/{sid}/v1/completions", self._complete, methods=["POST"]),
            Route("/sessions/{sid}/v1/models", self._models, methods=["GET"]),
        ], exception_handlers={404: self._no_route, 405: self._no_route})
        self._http: LoopServer | None = None

    def base_url(self, session: str) -> str:
        """What an agent passes as the openai client's base_url. A session id is URL-safe
        text (letters, digits, "-._~"): the path is unquoted before routing, so an escaped
        "/" would not route."""
        if not _SESSION_ID.fullmatch(session):
            raise ValueError(f"session id {session!r} must be letters, digits or -._~")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/sessions/{session}/v1"

    async def start(self) -> None:
        """Binds (self.port becomes the bound port) and serves as a task on this loop."""
        if self._http is not None:
            raise RuntimeError("the agent server is already started")
        http = LoopServer(self.app, host=self.host, port=self.port, name="agent-server",
                          grace_s=self.grace_s, max_connections=self.max_connections)
        await http.start()
        self._http, self.port = http, http.port
        log.info("agent endpoint on %s", self.base_url("SESSION"))

    async def stop(self) -> None:
        """Stops listening, lets requests under way finish (grace_s, then cancels them),
        closes every connection and the socket. Idempotent."""
        http, self._http = self._http, None
        if http is not None:
            await http.stop()

    @property
    def _socket(self) -> socket.socket | None:
        """The listening socket while serving."""
        return None if self._http is None else self._http.socket

    # ---- handlers

    async def _chat(self, request: Request) -> Response:
        return await self._answer(request, self._chat_turn)

    async def _complete(self, request: Request) -> Response:
        return await self._answer(request, self._completion_turn)

    async def _models(self, request: Request) -> Response:
        return await self._answer(request, self._model_list)

    async def _no_route(self, request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404

        async def refuse(_: Request) -> Response:
            raise _Refusal(status, "no_route", f"no route {request.method} {request.url.path}",
                           type="not_found_error" if status == 404 else "invalid_request_error",
                           code="not_found" if status == 404 else "method_not_allowed",
                           close=True)
        return await self._answer(request, refuse)

    async def _answer(self, request: Request,
                      turn: Callable[[Request], Awaitable[Response]]) -> Response:
        """Authorizes, runs the turn and maps every failure to a counted error reply."""
        self.counters["requests"] += 1
        try:
            self._authorize(request)
            response = await turn(request)
        except _Refusal as refusal:
            return self._refuse(refusal)
        except BadRequest as e:
            return self._refuse(_Refusal(400, "bad_request", str(e), param=e.param))
        except UnknownSession as e:
            return self._refuse(_Refusal(404, "unknown_session", str(e) or "no such session",
                                         type="not_found_error", code="unknown_session"))
        except SessionBusy as e:
            return self._refuse(_Refusal(
                409, "busy", str(e) or "the session has a request under way",
                type="conflict_error", code="session_busy"))
        except Exception:
            log.exception("agent endpoint: %s %s failed", request.method, request.url.path)
            return self._refuse(_Refusal(500, "failed", "internal error", type="server_error",
                                         code="internal_error"))
        self.counters["ok"] += 1
        return response

    def _authorize(self, request: Request) -> None:
        scheme, _, credential = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token_matches(credential.strip(), self._token):
            raise _Refusal(401, "unauthorized", "a valid bearer token is required",
                           type="authentication_error", code="invalid_api_key", close=True)

    async def _chat_turn(self, request: Request) -> Response:
        chat = parse_chat_request(await self._read_json(request))
        out = await self.backend.chat(request.path_params["sid"], chat)
        s, model = chat.sampling, chat.model or self.model
        ident, created = f"chatcmpl-{secrets.token_hex(12)}", int(time.time())
        if s.stream:
            return _stream(sse(chat_chunks(out, model=model, id=ident, created=created,
                                           logprobs=s.logprobs, include_usage=s.include_usage)))
        return _json(chat_completion(out, model=model, id=ident, created=created,
                                     logprobs=s.logprobs))

    async def _completion_turn(self, request: Request) -> Response:
        completion = parse_completion_request(await self._read_json(request))
        out = await self.backend.complete(request.path_params["sid"], completion)
        s, model = completion.sampling, completion.model or self.model
        ident, created = f"cmpl-{secrets.token_hex(12)}", int(time.time())
        if s.stream:
            return _stream(sse(completion_chunks(
                out, model=model, id=ident, created=created, logprobs=s.logprobs,
                include_usage=s.include_usage)))
        return _json(text_completion(out, model=model, id=ident, created=created,
                                     logprobs=s.logprobs))

    async def _model_list(self, request: Request) -> Response:
        return _json(model_list(self.model))

    async def _read_json(self, request: Request) -> Any:
        """The body, at most max_body_bytes of it held, decoded as JSON."""
        too_large = _Refusal(413, "too_large", f"the body is over {self.max_body_bytes} bytes",
                             code="request_too_large", close=True)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            raise too_large
        body = bytearray()
        try:
            async with asyncio.timeout(self.read_timeout_s):  # a body that trickles in holds a slot no longer
                async for chunk in request.stream():
                    if len(body) + len(chunk) > self.max_body_bytes:
                        raise too_large
                    body += chunk
        except ClientDisconnect:
            raise _Refusal(400, "disconnected", "the client went away", close=True) from None
        except TimeoutError:
            raise _Refusal(408, "slow_body", f"the body took over {self.read_timeout_s:g} s", close=True) from None
        try:
            return json.loads(body, parse_constant=_no_constant)
        except (ValueError, RecursionError) as e:
            raise _Refusal(400, "bad_json", f"the body is not valid JSON: {e}",
                           code="invalid_json") from None

    def _refuse(self, refusal: _Refusal) -> Response:
        self.counters[refusal.counter] += 1
        headers = {"connection": "close"} if refusal.close else {}
        if refusal.status == 401:
            headers["www-authenticate"] = "Bearer"
        return _json(error_body(str(refusal), refusal.type, refusal.param, refusal.code),
                     status=refusal.status, headers=headers)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json(obj: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(obj), status_code=status, headers=headers,
                    media_type="application/json")


def _stream(events: list[bytes]) -> StreamingResponse:
    async def chunks():
        for event in events:
            yield event
    return StreamingResponse(chunks(), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})
