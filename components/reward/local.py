"""reward.function called in the reward worker's own process.

An async function runs on the worker's loop (it must not block it: the worker's
heartbeat runs there); a sync one in a thread of the worker's own pool, so a slow one
does not stall the loop (threads.py). At most reward.max_concurrency calls are in
flight. A call past reward.timeout_s is given up: its sample gets on_error. Python
cannot stop a thread, so a sync call that never returns keeps its thread busy for the
rest of the run (later calls wait for the others, their wait counted in their own
timeout); reward.sandbox kills such a call instead.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, Mapping

from dynarl.components.reward.config import RewardSection
from dynarl.components.reward.loading import BATCH_KEYWORDS, KEYWORDS, keywords_for, load_function, parse_spec
from dynarl.components.reward.outcome import Outcome, RewardInput, failed, judged, timeout_message
from dynarl.components.reward.threads import DaemonPool

SINGULAR = {"prompts": "prompt", "problem_ids": "problem_id", "sample_ids": "sample_id", "metadata": "metadata"}
"""A batched call's keyword -> the RewardInput field its list holds."""


class LocalReward:
    def __init__(self, section: RewardSection) -> None:
        self.section = section
        self.fn: Callable[..., Any] = load_function(parse_spec(section.function), section.batched)
        self.keywords = keywords_for(self.fn, BATCH_KEYWORDS if section.batched else KEYWORDS)
        self.is_async = inspect.iscoroutinefunction(self.fn) or \
            inspect.iscoroutinefunction(getattr(self.fn, "__call__", None))
        self.pool = DaemonPool(section.max_concurrency)
        self._slots: asyncio.Semaphore | None = None

    async def score(self, inputs: list[RewardInput]) -> list[Outcome]:
        """Every sample's outcome, in order."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.section.max_concurrency)
        if self.section.batched:
            return await self._batch(inputs)
        return list(await asyncio.gather(*(self._one(x) for x in inputs)))

    def close(self) -> None:
        self.pool.close()

    async def _one(self, x: RewardInput) -> Outcome:
        kwargs = {k: getattr(x, k) for k in self.keywords}
        value, failure = await self._call((x.response, x.answer), kwargs)
        return failure or judged(value, self.section.on_error)

    async def _batch(self, inputs: list[RewardInput]) -> list[Outcome]:
        kwargs = {k: [getattr(x, SINGULAR[k]) for x in inputs] for k in self.keywords}
        value, failure = await self._call(([x.response for x in inputs], [x.answer for x in inputs]), kwargs)
        if failure is not None:  # the call failed: each of its samples did
            return [failure] * len(inputs)
        return batch_outcomes(value, len(inputs), self.section.on_error)

    async def _call(self, args: tuple, kwargs: dict[str, Any]) -> tuple[Any, Outcome | None]:
        """(the function's return, None), or (None, the failed Outcome of a raise or a timeout)."""
        on_error = self.section.on_error
        async with self._slots:
            try:
                async with asyncio.timeout(self.section.timeout_s):
                    if self.is_async:
                        value = await self.fn(*args, **kwargs)
                    else:
                        value = await self.pool.run(functools.partial(self.fn, *args, **kwargs))
                    if inspect.isawaitable(value):
                        value = await value
            except TimeoutError:
                return None, failed("timeout", timeout_message(self.section.timeout_s), on_error)
            except Exception as exc:  # the function's own error: its sample(s) only
                return None, failed("error", f"{type(exc).__name__}: {exc}", on_error)
        return value, None


def batch_outcomes(value: Any, n: int, on_error: float) -> list[Outcome]:
    """A batched call's return as its `n` samples' outcomes: a list of n results, each
    judged alone; anything else fails them all."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__len__") or not hasattr(value, "__iter__"):
        kind = "None" if value is None else f"a {type(value).__name__}"
        return [failed("error", f"a batched call returned {kind}, not a list of {n} results", on_error)] * n
    results = list(value)
    if len(results) != n:
        return [failed("error", f"a batched call returned {len(results)} results for {n} samples", on_error)] * n
    return [judged(v, on_error) for v in results]
