"""A GRPO step in progress, as a scheduler that moves devices during it sees it.

Every step (pipeline.py) runs its stages through a LiveStep:
- a component may gain ranks while its stage runs (a receiver of devices): each new
  rank runs the stage's method on the same input channel as an extra task beside
  the stage, and gets its own END once the upstream component (its stage and every
  extra rank) is done; the downstream waits for the extras too, so nothing is cut off;
- a component's stage may wait, holding its devices' lock, until its gate opens (its
  devices are lent to another component meanwhile: DynaRL's start, where the rollout
  runs on every device while inference and the trainer have nothing to do);
- the rollout stage may run without the device lock (`rollout_lock`: while it runs on
  lent devices, parking and the gates keep the components apart, and the lock would
  hold the lenders' devices);
- a component that works after the others (the barrier trainer) is `later`: it can
  take devices until its stage begins.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Sequence

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
    later: set[str] = field(default_factory=set)
    """Components whose stage comes after the others' (it has not begun)."""

    def accepts(self, component: str) -> bool:
        """The component's stage runs and can still take ranks, or is still to come."""
        return component in self.later or (component in self.done and not self.done[component].done())

    def gate(self, component: str) -> asyncio.Future:
        """Closes the component's gate (before its stage starts); set its result to open it."""
        gate = self.gates[component] = asyncio.get_running_loop().create_future()
        return gate

    def park(self, components: Sequence[str]) -> None:
        """The components' devices are lent: their stages wait (gates closed)."""
        for component in components:
            self.gate(component)

    def unpark(self, components: Sequence[str]) -> None:
        """Their devices are back: their stages may compute."""
        for component in components:
            gate = self.gates.get(component)
            if gate is not None and not gate.done():
                gate.set_result(None)

    async def finished(self, component: str) -> None:
        """Waits until the component's stage (registered) and every extra rank are done (not raising)."""
        await asyncio.wait([self.done[component]])

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


@dataclass(slots=True)
class SelectedLive(LiveStep):
    """A step whose batch a closer selects from the scored groups (partial.py,
    refill.py): inference reads it from "ahead", and an inference rank joining the step
    ends once the closer is done."""
    INPUT = {**INPUT, "inference": "ahead"}
    UPSTREAM = {**UPSTREAM, "inference": "closer"}


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
