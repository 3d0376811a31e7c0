"""A GRPO step in progress, as a scheduler that moves devices during it sees it.

A streaming step (grpo.py) runs its stages through a LiveStep:
- a component may gain ranks while its stage runs (a receiver of devices): each new
  rank runs the stage's method on the same input channel as an extra task beside
  the stage, and gets its own END once the upstream component (its stage and every
  extra rank) is done; the downstream waits for the extras too, so nothing is cut off;
- a component's stage may wait, holding its devices' lock, until its gate opens (its
  devices are lent to another component meanwhile: DynaRL's start, where the rollout
  runs on every device while inference and the trainer have nothing to do);
- the rollout stage may run without the device lock (`rollout_lock`: while it runs on
  lent devices, parking and the gates keep the components apart, and the lock would
  hold the lenders' devices).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncContextManager, Awaitable, Protocol

from dynarl.components.experience import END

if TYPE_CHECKING:
    from dynarl.core.controller import Controller

INPUT = {"rollout": "prompts", "inference": "scored", "trainer": "experience"}
"""The channel each component's stage reads."""
UPSTREAM = {"inference": "reward", "trainer": "inference"}
"""Whose end lets a component's extra ranks end."""


@dataclass(slots=True)
class LiveStep:
    INPUT = INPUT
    UPSTREAM = UPSTREAM
    version: int
    done: dict[str, asyncio.Future] = field(default_factory=dict)
    """Component -> its stage and every extra rank finished (the per-rank results)."""
    extras: dict[str, list[asyncio.Future]] = field(default_factory=lambda: {c: [] for c in INPUT})
    gates: dict[str, asyncio.Future] = field(default_factory=dict)
    """Component -> opens when it may compute (absent: at once)."""
    rollout_lock: bool = True

    def accepts(self, component: str) -> bool:
        """The component's stage runs and can still take ranks."""
        return component in self.done and not self.done[component].done()

    def gate(self, component: str) -> asyncio.Future:
        """Closes the component's gate (before its stage starts); set its result to open it."""
        gate = self.gates[component] = asyncio.get_running_loop().create_future()
        return gate

    def add_rank(self, ctl: "Controller", component: str, call: Awaitable[Any]) -> None:
        """`call`: the new rank's stage call (an awaitable of its result). Synchronous, so the
        check of accepts() and the append cannot interleave with the component finishing."""
        if not self.accepts(component):
            raise RuntimeError(f"{component} has finished step {self.version}")
        self.extras[component].append(asyncio.ensure_future(call))

        async def end_after_upstream() -> None:
            await asyncio.wait([self.done[self.UPSTREAM[component]]])
            inbox = ctl.channel(self.INPUT[component])  # the stage's own input: its edge is the stage's
            await inbox.put(END)
        self.extras[component].append(asyncio.ensure_future(end_after_upstream()))

    def joined(self, component: str, stage: Awaitable[list[Any]]) -> asyncio.Future:
        """The component's stage and its extra ranks, as one future of all their results."""
        self.done[component] = future = asyncio.ensure_future(joined(stage, self.extras[component]))
        return future


class StepHooks(Protocol):
    """What a scheduler that moves devices during a step plugs into it (grpo.py)."""

    async def before_step(self, live: LiveStep) -> None:
        """Before the step's prompts go out (back to the start placement, lend devices)."""
    async def during_step(self, live: LiveStep) -> None:
        """Runs beside the step (decisions, moves) until cancelled after its weight sync."""
    def sync_lock(self) -> AsyncContextManager[Any]:
        """Held for the weight sync: no move changes the groups while the weights go out."""


async def joined(stage: Awaitable[list[Any]], extras: list[asyncio.Future]) -> list[Any]:
    """The stage's per-rank results, then each extra rank's (extras may be added meanwhile)."""
    stage_future = asyncio.ensure_future(stage)
    try:
        results = list(await stage_future)
        i = 0
        while i < len(extras):  # extras may be added while we wait
            value = await extras[i]
            if value is not None:
                results.append(value)
            i += 1
        return results
    except BaseException:
        stage_future.cancel()
        for e in extras:
            e.cancel()
        raise
