"""ZeroMQ endpoint strings."""
from __future__ import annotations

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
"""Hosts that name this machine only: every peer of a socket bound there is local."""


def with_host(endpoint: str, host: str) -> str:
    """tcp://0.0.0.0:5555 -> tcp://HOST:5555: what to tell peers of a socket whose
    LAST_ENDPOINT names the wildcard it is bound to."""
    scheme, _, rest = endpoint.partition("://")
    port = rest.rsplit(":", 1)[1]
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
