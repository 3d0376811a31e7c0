"""What a move sees of the running step and asks of its workflow: the two handles
the workflow gives the Mover when it builds it (components/workflows/live.py
LiveStep, joins.py StepRanks)."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Awaitable, Protocol, Sequence

if TYPE_CHECKING:
    from dynarl.core.controller import Controller
    from dynarl.core.worker_group import WorkerGroup


class Step(Protocol):
    """The running step as a move sees it."""
    version: int
    extras: dict[str, list[asyncio.Future]]
    done: dict[str, asyncio.Future]

    def accepts(self, component: str) -> bool: ...
    def add_rank(self, ctl: "Controller", component: str, call: Awaitable[Any]) -> None: ...
    def park(self, components: Sequence[str]) -> None: ...
    def unpark(self, components: Sequence[str]) -> None: ...


class Joins(Protocol):
    """How ranks leave and join the workflow's running step."""

    async def releasing(self, component: str, ranks: list[str], parked: bool = False) -> None: ...
    async def ready_ranks(self, component: str, group: "WorkerGroup", positions: list[int], version: int | None,
                          ) -> None: ...
    def stage_call(self, component: str, position: int, version: int) -> Awaitable[Any]: ...
    async def joined(self, component: str, ranks: list[str]) -> None: ...
    def rank_init(self, component: str, tp: int | None = None) -> dict[str, Any]: ...
    async def replaced(self, component: str, group: "WorkerGroup") -> None:
        """A move replaced the component's group (a P2P reshard): the workflow uses it from
        now on (and what follows the component's devices moves with it: ppo's critic)."""
