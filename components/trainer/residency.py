"""Where a trainer worker's engine state is, the device or the host, and the reads
that need it on the device.

The device_lock moves a time-sharing trainer's state off its device between its
turns (offload; megatron frees the device storage). Some reads run outside the lock
(the weight sync, a P2P export, a checkpoint, a digest): they bring the state back
for their duration (`on_device`). Every change of residency, theirs and the lock's,
takes one lock, so a read never sees its state offloaded under it and the lock's
onload never lands in the middle of a read that offloads after.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
from typing import Any, AsyncIterator, Awaitable, Callable, Concatenate, Coroutine, ParamSpec, TypeVar


class Residency:
    """Mixin of a trainer worker whose engine (`self.trainer`: onload, offload,
    is_onloaded, frees_offloaded_state) may be offloaded."""
    trainer: Any
    _residency: asyncio.Lock | None = None

    def _residency_lock(self) -> asyncio.Lock:
        if self._residency is None:
            self._residency = asyncio.Lock()
        return self._residency

    @contextlib.asynccontextmanager
    async def resident(self) -> AsyncIterator[None]:
        """The engine's state on its device while the body runs: onloaded if it was
        offloaded, and offloaded again after."""
        async with self._residency_lock():
            if self.trainer is None or self.trainer.is_onloaded or not self.trainer.frees_offloaded_state:
                yield  # (a native trainer's offloaded state is readable in host memory)
                return
            await self.trainer.onload()
            try:
                yield
            finally:
                await self.trainer.offload()

    async def set_resident(self, on_device: bool) -> None:
        """The device_lock's move (onload on acquiring, offload on release), after any read under way."""
        async with self._residency_lock():
            await (self.trainer.onload() if on_device else self.trainer.offload())


P = ParamSpec("P")
R = TypeVar("R")
W = TypeVar("W", bound=Residency)


def on_device(method: Callable[Concatenate[W, P], Awaitable[R]]
              ) -> Callable[Concatenate[W, P], Coroutine[Any, Any, R]]:
    """Runs a trainer worker's `method`, which reads the engine's state outside the
    device_lock, with that state on the device (Residency.resident). Such methods do
    not call each other (the lock is not reentrant)."""
    @functools.wraps(method)
    async def run(self: W, *args: P.args, **kwargs: P.kwargs) -> R:
        async with self.resident():
            return await method(self, *args, **kwargs)
    return run
