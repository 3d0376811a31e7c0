"""SimRolloutWorker: one rollout engine instance (TP devices) of the simulated cluster.

The same job as components/rollout/worker.py (prompt groups in from a channel,
finished groups out in chunks, continuous batching in between), on an
EmulatedRolloutEngine: time comes from the cost model, lengths from the workload.
A rank stands for one engine; its spec device is the engine's first device and
it covers `tp` consecutive devices.

Single-turn samples become one request of exactly `len` tokens. A multi-turn
sample is an episode: each turn's prompt is the context so far (prompt, earlier
turns' output and tool output), so the engine's prefix cache serves the previous
turns; between turns the tool runs for its latency, off the device.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Any

import dynarl
from dynarl.components.experience import END
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.rollout.emulated.tokens import response_tokens

from .switching import add_busy, half_switch


class SimRolloutWorker(dynarl.Worker):
    def __init__(self, engine: dict, shares_device: bool = False) -> None:
        self.engine = EmulatedRolloutEngine(EmulatedRolloutConfig(**engine))
        self.shares_device = shares_device
        self.time_scale = self.engine.config.time_scale
        self.vocab = self.engine.model.vocab_size

    async def onload(self) -> None:
        await half_switch(self.shares_device, self.time_scale)
        self.engine.resume_memory()

    async def offload(self) -> None:
        await half_switch(self.shares_device, self.time_scale)
        if self.shares_device:
            self.engine.release_memory()

    def receive_weights(self, version: int, num_bytes: int) -> int:
        """The transfer is charged to the engine's next step (EmulatedRolloutEngine)."""
        self.engine.update_weights(num_bytes, version)
        return version

    def load(self) -> dict[str, float]:
        load = self.engine.load()
        return {"utilization": load.utilization, "running": load.num_running, "waiting": load.num_waiting}

    async def generate(self, get: str, put: str, *, version: int, chunk_size: int = 1) -> dict[str, Any]:
        """Consumes prompt groups from `get` until END; puts finished groups on `put` in
        chunks of `chunk_size`. Returns counters and the engine's busy intervals."""
        if self.engine.weight_version != version:
            raise RuntimeError(f"rollout holds weights v{self.engine.weight_version}, the step needs v{version}")
        run = _Run(self, self.channel(put), chunk_size)
        fetch = asyncio.ensure_future(run.fetch(self.channel(get)))
        try:
            await run.drive(fetch)
        finally:
            fetch.cancel()
        return {"groups": run.num_groups, "tokens": run.num_tokens, "busy": run.busy, "tp": self.engine.config.tp,
                "preemptions": self.engine.scheduler.num_preemptions}


class _Run:
    """One iteration's generation on one engine."""

    def __init__(self, worker: SimRolloutWorker, outbox: Any, chunk_size: int) -> None:
        self.w, self.engine, self.outbox, self.chunk_size = worker, worker.engine, outbox, chunk_size
        self.waiting: dict[str, asyncio.Future] = {}
        self.episodes: set[asyncio.Task] = set()
        self.ready: list[dict] = []
        self.wake = asyncio.Event()
        self.busy: list[list[float]] = []
        self.num_groups = self.num_tokens = 0

    async def fetch(self, inbox: Any) -> None:
        while (group := await inbox.get()) is not END:
            self.num_groups += 1
            task = asyncio.ensure_future(self.group(group))
            self.episodes.add(task)
            task.add_done_callback(self._episode_done)

    def _episode_done(self, task: asyncio.Task) -> None:
        self.episodes.discard(task)
        self.wake.set()

    async def drive(self, fetch: asyncio.Future) -> None:
        loop = asyncio.get_running_loop()
        while not (fetch.done() and not self.episodes):
            for task in [fetch, *self.episodes]:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            if not self.engine.has_work():
                self.wake.clear()
                waiter = asyncio.ensure_future(self.wake.wait())
                # woken by a new request, a finished episode, or (until it ends) the fetch
                await asyncio.wait([waiter] if fetch.done() else [fetch, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            start = loop.time()
            results = await self.engine.step()
            add_busy(self.busy, start, loop.time())
            for result in results:
                self.waiting.pop(result.request_id).set_result(len(result.output_token_ids))
            await asyncio.sleep(0)  # let fetch and episodes add requests between steps
        fetch.result()
        if self.ready:
            await self._emit()
        await self.outbox.flush()

    async def request(self, rid: str, prompt: list[int], tokens: int) -> int:
        future = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        self.engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=tokens)))
        self.wake.set()
        return await future

    async def group(self, group: dict) -> None:
        prompt = token_ids(group["prompt"], group["prompt_len"], self.w.vocab)
        await asyncio.gather(*(self.sample(s, prompt) for s in group["samples"]))
        self.ready.append(group)
        if len(self.ready) >= self.chunk_size:
            await self._emit()

    async def sample(self, s: dict, prompt: list[int]) -> None:
        if "turns" not in s:
            s["gen"] = await self.request(s["id"], prompt, s["len"])
            s["seq"] = len(prompt) + s["gen"]
            self.num_tokens += s["gen"]
            return
        context, generated = list(prompt), 0
        for k, (gen, latency, obs) in enumerate(s["turns"]):
            rid = f"{s['id']}#{k}"
            await self.request(rid, context, gen)
            generated += gen
            # the turn's output ids, as the engine made them (a pure function of the request)
            context += response_tokens(zlib.crc32(rid.encode()), 0, gen, gen, self.w.vocab)
            if latency > 0:
                await asyncio.sleep(latency * self.w.time_scale)  # the tool runs off the device
            context += token_ids(rid, obs, self.w.vocab) if obs else []
        s["gen"], s["seq"] = generated, len(context)
        self.num_tokens += generated

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.outbox.put(chunk, weight=len(chunk))


def token_ids(key: str, length: int, vocab: int) -> list[int]:
    """Deterministic synthetic ids for a prompt or a tool output named `key`."""
    return response_tokens(zlib.crc32(key.encode()) ^ 0x7F4A7C15, 0, length, length, vocab)
