"""The dashboard's HTTP side: the page, its scripts, and the JSON views of a run directory
(feed.py), served on the running loop (core/http_server.py: `dynarl train` serves it on
the controller's loop with run.dashboard, `dynarl dashboard RUN_DIR` on its own).

    GET /                       the page (static/index.html)
    GET /static/NAME            its script, style and the vendored uPlot
    GET /api/summary            the run                        feed.summary
    GET /api/curves             per-step charts                feed.curves
    GET /api/migrations         moves and plans                feed.migrations
    GET /api/step?step=N        one step (default: the last)   feed.step_view
    GET /api/samples?step=N&min_reward=R&max_reward=R&limit=K  feed.samples
    GET /api/sample?step=N&id=ID                           feed.sample

Every request, whatever its path, needs the job's token: `?token=T` (the page's address,
printed at start, and its scripts') or `Authorization: Bearer T` (the page's data
requests); none is answered 401, a wrong one 403, compared in constant time. It binds
only its configured host (loopback by default). It only reads: it writes nothing to
the run directory and changes nothing in the run. Files are read off the loop (a
worker thread), so a large samples file never stalls the controller.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import secrets
from typing import Any, Callable
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dynarl.components.workflows.span_log import spans_of
from dynarl.core.http_server import LoopServer, is_loopback, token_matches
from dynarl.launch.dashboard import feed
from dynarl.launch.dashboard.run_files import RunFiles
from dynarl.launch.run_dir import owner_of

log = logging.getLogger(__name__)

STATIC = os.path.join(os.path.dirname(__file__), "static")
ASSETS = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "uPlot.iife.min.js": "text/javascript",
          "uPlot.min.css": "text/css"}
"""The files under static/ the page loads (no other path is served)."""
HEADERS = {
    "cache-control": "no-store",
    "referrer-policy": "no-referrer",  # the token in the address goes nowhere else
    "x-content-type-options": "nosniff",
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}


def new_token() -> str:
    """A job's dashboard token: 128 random bits, URL-safe."""
    return secrets.token_urlsafe(16)


class TokenGuard:
    """ASGI middleware: a request reaches `app` only with the token (before any routing,
    so an unknown path without it is refused too)."""

    def __init__(self, app: Any, token: str) -> None:
        if not token:
            raise ValueError("token must not be empty (it is the dashboard's only guard)")
        self.app, self._token = app, token.encode()
        self.refused = 0

    async def __call__(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "http":
            status = self.refusal(scope)
            if status is not None:
                self.refused += 1
                text = "a token is required" if status == 401 else "wrong token"
                response = Response(text + "\n", status_code=status, media_type="text/plain",
                                    headers={**HEADERS, "www-authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict[str, Any]) -> int | None:
        """401 without a token, 403 with a wrong one, None with the right one."""
        given = None
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credential = value.decode("latin-1").partition(" ")
                if scheme.lower() == "bearer":
                    given = credential.strip()
        if given is None:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            given = (query.get("token") or [None])[0]
        if not given:
            return 401
        return None if token_matches(given, self._token) else 403


def dashboard_app(run_dir: str, token: str) -> TokenGuard:
    """The dashboard's ASGI app over `run_dir`, behind its token."""
    files = RunFiles(run_dir)

    def page() -> str:
        with open(os.path.join(STATIC, "index.html")) as f:  # (the token: URL-safe characters only)
            return f.read().replace("{{TOKEN}}", token)

    def spans() -> list:
        return spans_of(files.spans.records())

    def view(request: Request) -> tuple[str, Callable[[], Any]]:
        q = request.query_params
        name = request.path_params["name"]
        if name == "summary":
            return name, lambda: feed.summary(files.metrics.records(), files.config(), os.path.abspath(run_dir),
                                              owner_of(run_dir) is not None)
        if name == "curves":
            return name, lambda: feed.curves(files.metrics.records(), spans())
        if name == "migrations":
            return name, lambda: feed.migrations(files.metrics.records())
        if name == "step":
            step = _int(q, "step")
            return name, lambda: feed.step_view(files.metrics.records(), spans(), step,
                                                feed.num_devices(files.config()))
        if name == "samples":
            args = (_int(q, "step"), _float(q, "min_reward"), _float(q, "max_reward"), _int(q, "limit") or 200)
            return name, lambda: feed.samples(files.samples.records(), *args)
        if name == "sample":
            step, ident = _int(q, "step"), q.get("id", "")
            if step is None:
                raise ValueError("step is required")
            return name, lambda: feed.sample(files.samples.records(), step, ident)
        raise LookupError(name)

    async def api(request: Request) -> Response:
        try:
            _, compute = view(request)
        except LookupError:
            return JSONResponse({"error": "no such view"}, status_code=404, headers=HEADERS)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400, headers=HEADERS)
        body = await asyncio.to_thread(lambda: json.dumps(finite(compute()), allow_nan=False))
        return Response(body, media_type="application/json", headers=HEADERS)

    async def index(request: Request) -> Response:
        return Response(await asyncio.to_thread(page), media_type="text/html", headers=HEADERS)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("not found\n", status_code=404, media_type="text/plain", headers=HEADERS)
        with open(os.path.join(STATIC, name), "rb") as f:
            return Response(f.read(), media_type=ASSETS[name], headers=HEADERS)

    app = Starlette(routes=[Route("/", index), Route("/static/{name}", asset), Route("/api/{name}", api)])
    return TokenGuard(app, token)


class DashboardServer:
    """The dashboard over `run_dir`, served on the running loop between start() and stop()."""

    def __init__(self, run_dir: str, token: str | None = None, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.run_dir, self.token = run_dir, token or new_token()
        self.app = dashboard_app(run_dir, self.token)
        self.http = LoopServer(self.app, host=host, port=port, name="dashboard", grace_s=1.0, max_connections=64)
        if not is_loopback(host):
            log.warning("the dashboard binds %s, not loopback: its token travels in plain HTTP", host)

    @property
    def url(self) -> str:
        """The page's address, the token in it (what a person opens)."""
        return self.http.url(f"/?token={self.token}")

    async def start(self) -> None:
        await self.http.start()

    async def stop(self) -> None:
        await self.http.stop()


def _int(q: Any, name: str) -> int | None:
    text = q.get(name)
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _float(q: Any, name: str) -> float | None:
    text = q.get(name)
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {text!r}") from None
    if value != value:
        raise ValueError(f"{name} must be a number, got {text!r}")
    return value


def finite(value: Any) -> Any:
    """`value` with NaN and infinities as None (metrics.jsonl may hold them: a non-finite
    loss); a browser's JSON.parse takes neither."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value
