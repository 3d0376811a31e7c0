"""How worker processes come to exist. The controller code is the same for every
launcher; a launcher only starts, watches and stops ranks.

Launchers register by name; `dynarl/__init__.py` imports the built-in ones, so
core never imports launch (dependency direction: launch -> core).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_handle import WorkerHandle


class Launcher(ABC):
    name = "base"

    async def start(self, ctl: "Controller") -> None:
        """Called once when the controller opens."""

    @abstractmethod
    async def spawn(self, handle: "WorkerHandle") -> None:
        """Starts the rank's process (or object). Returns once started; the
        handle becomes `connected` when the worker says hello."""

    @abstractmethod
    async def free_port(self, node: int) -> int:
        """A free TCP port on `node` for a group's torchrun-style MASTER_PORT."""

    def node_address(self, node: int) -> str:
        return "127.0.0.1"

    @abstractmethod
    async def stop(self, handle: "WorkerHandle", grace_s: float) -> None:
        """Waits up to `grace_s` for the rank to exit after its __stop__ call, then
        SIGTERMs its process group (the worker itself outlives that: worker_main.
        after_sigterm; what it started may not), then SIGKILLs it. Always reaps."""

    @abstractmethod
    def kill(self, handle: "WorkerHandle") -> None:
        """SIGKILL now (failure injection, last-resort cleanup)."""

    async def close(self) -> None:
        """Called last at shutdown: anything still running is killed and reaped."""


_REGISTRY: dict[str, Callable[[], Launcher]] = {}


def register_launcher(name: str, factory: Callable[[], Launcher]) -> None:
    _REGISTRY[name] = factory


def make_launcher(name: str) -> Launcher:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown launcher {name!r}; registered: {', '.join(sorted(_REGISTRY))}") from None
