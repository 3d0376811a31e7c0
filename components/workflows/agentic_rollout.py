"""The rollout rank of the agentic workflow: a RolloutWorker that serves single
turns of multi-turn episodes.

The controller routes each turn to a rank (DataRouter: a follow-up turn prefers
the rank whose prefix cache holds its context) by putting it on channel `get`
under that rank's key. The rank adds it to its engine with the episode's tool
count and its arrival time, so the engine's queue key (FIFO or DynaRL priority,
set by `set_queue_policy`) orders its waiting queue, and puts every finished
turn on `put` at once: the episode's next step (a tool call) should not wait for
a chunk. Each result carries the prompt tokens the prefix cache served and how
long the turn waited for admission.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from dynarl.components import weight_sync
from dynarl.components.experience import END
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.core.priority import PriorityConfig


class TurnWaits:
    """How long each turn waited in an engine's queue, from its arrival to its
    admission (or to its result, if it finished within the step that admitted it)."""

    def __init__(self) -> None:
        self.queued: dict[str, float] = {}
        """request id -> arrival time, until the engine admits it."""
        self.admitted: dict[str, float] = {}

    def arrived(self, request_id: str, now: float) -> None:
        self.queued[request_id] = now

    def after_step(self, engine: Any, now: float) -> None:
        if self.queued:  # not on every step: most steps admit nothing
            for rid in engine.running_request_ids():  # admitted in this step (or before)
                if rid in self.queued:
                    self.admitted[rid] = now - self.queued.pop(rid)

    def finished(self, request_id: str, now: float) -> float:
        wait = self.admitted.pop(request_id, None)
        return now - self.queued.pop(request_id, now) if wait is None else wait


def turn_result(r: Any, wait_s: float) -> dict[str, Any]:
    """A finished turn as the episode driver takes it (msgpack-safe)."""
    return {"id": r.request_id, "output_ids": r.output_token_ids, "logprobs": r.output_logprobs,
            "finish": r.finish_reason, "version": r.weight_version, "cached_tokens": r.cached_tokens,
            "wait_s": wait_s}


class AgenticRolloutWorker(RolloutWorker):
    def set_queue_policy(self, policy: str, max_bonus_s: float) -> None:
        self.engine.set_queue_key(make_queue_key(policy, PriorityConfig(max_bonus_s=max_bonus_s)))

    async def serve_turns(self, get: str, put: str, key: int, version: int, sampling: dict[str, Any]) -> dict:
        """Turns {"id", "prompt_ids", "seed", "tool_count", "max_new_tokens"} from
        `get` (under `key`) until END; each result goes to `put`. Returns counters."""
        if self.engine.weight_version != version:
            raise weight_sync.StaleWeights(f"rollout holds weights v{self.engine.weight_version}, "
                                           f"the step needs v{version}")
        inbox, outbox = self.channel(get), self.channel(put)
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()
        waits = TurnWaits()
        counters = {"turns": 0, "tokens": 0, "cached_tokens": 0, "engine_steps": 0, "max_wait_s": 0.0}

        async def fetch() -> None:
            while (item := await inbox.get(key)) is not END:
                now = loop.time()
                self.engine.add_request(GenerationRequest(
                    item["id"], list(item["prompt_ids"]),
                    SamplingParams(**(sampling | {"max_new_tokens": item["max_new_tokens"]}), seed=item["seed"]),
                    tool_count=item["tool_count"], arrival_time=now))
                waits.arrived(item["id"], now)
                arrived.set()

        started = time.perf_counter()
        fetcher = asyncio.ensure_future(fetch())
        try:
            while True:
                if not self.engine.has_work():
                    if fetcher.done():
                        fetcher.result()
                        break
                    arrived.clear()
                    waiter = asyncio.ensure_future(arrived.wait())
                    await asyncio.wait([fetcher, waiter], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    continue
                results = await self.engine.step()
                counters["engine_steps"] += 1
                now = loop.time()
                waits.after_step(self.engine, now)
                for r in results:
                    wait = waits.finished(r.request_id, now)
                    counters["turns"] += 1
                    counters["tokens"] += len(r.output_token_ids)
                    counters["cached_tokens"] += r.cached_tokens
                    counters["max_wait_s"] = max(counters["max_wait_s"], wait)
                    await outbox.put(turn_result(r, wait))
                await asyncio.sleep(0)  # lets fetch add turns that arrived meanwhile
        finally:
            fetcher.cancel()
        await outbox.flush()
        self.tokens_done += counters["tokens"]
        return counters | {"busy_s": time.perf_counter() - started}
