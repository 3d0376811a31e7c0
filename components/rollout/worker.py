"""RolloutWorker: one rank of the rollout component, wrapping a rollout engine.

It reads prompt groups from a channel, generates every group's samples with
continuous batching, and puts finished groups downstream in chunks as soon as a
chunk is complete, so the next stage starts while the long tail still decodes.
Weights arrive over a runtime process group (weight_sync.py); the engine's
version is checked before a step generates, so a stale policy never samples.

device_lock: when this rank shares its device (temporal / hybrid placement),
offload frees the KV cache and the prefix cache (`release_memory`), and onload
allocates them again; the weights stay resident, as they must to receive the
next update. On a device of its own the cache simply stays.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import dynarl
from dynarl.components import weight_sync
from dynarl.components.experience import END, Group
from dynarl.components.model.spec import ModelSpec, build_model
from dynarl.components.rollout.base import GenerationRequest, GenerationResult, SamplingParams
from dynarl.components.rollout.native.engine import NativeEngineConfig, NativeRolloutEngine


class RolloutWorker(dynarl.Worker):
    def __init__(self, model: dict, engine: dict, bucket_bytes: int, shares_device: bool = False) -> None:
        self.engine = NativeRolloutEngine(build_model(ModelSpec(**model)), NativeEngineConfig(**engine),
                                          weight_version=-1)  # no policy weights until the first sync
        self.bucket_bytes = bucket_bytes
        self.shares_device = shares_device
        if shares_device:
            self.engine.release_memory()  # starts off the device; onload brings the cache

    async def onload(self) -> None:
        if self.shares_device:
            self.engine.resume_memory()

    async def offload(self) -> None:
        if self.shares_device:
            self.engine.release_memory()

    async def receive_weights(self, group: str) -> int:
        named, version = await asyncio.to_thread(weight_sync.receive, self.process_group(group),
                                                 self.engine.model, self.bucket_bytes, self.engine.weight_version)
        self.engine.update_weights(named, version)
        return version

    async def generate(self, get: str, put: str, *, version: int, chunk_size: int, sampling: dict[str, Any]) -> dict:
        """Consumes prompt groups from `get` until END; puts chunks of finished
        groups (at most `chunk_size` each) on `put`. Returns counters."""
        if self.engine.weight_version != version:
            raise weight_sync.StaleWeights(f"rollout holds weights v{self.engine.weight_version}, "
                                           f"the step needs v{version}")
        run = _Generation(self.engine, self.channel(put), chunk_size, sampling)
        started = time.perf_counter()
        fetch = asyncio.ensure_future(run.fetch(self.channel(get)))  # prefetch 1: never take a second END
        try:
            await run.drive(fetch)
        finally:
            fetch.cancel()
        return {"groups": run.num_groups, "tokens": run.num_tokens, "engine_steps": run.num_steps,
                "busy_s": time.perf_counter() - started}


class _Generation:
    """One step's generation on one rank: fetch prompts, step the engine, emit chunks."""

    def __init__(self, engine: NativeRolloutEngine, outbox: Any, chunk_size: int, sampling: dict) -> None:
        self.engine = engine
        self.outbox = outbox
        self.chunk_size = chunk_size
        self.sampling = sampling
        self.pending: dict[str, tuple[Group, int]] = {}
        """request id -> (its group, its sample index)."""
        self.left: dict[int, int] = {}
        """group index -> samples still generating."""
        self.ready: list[Group] = []
        self.arrived = asyncio.Event()
        self.num_groups = self.num_tokens = self.num_steps = 0

    async def fetch(self, inbox: Any) -> None:
        while (group := await inbox.get()) is not END:
            for k, sample in enumerate(group["samples"]):
                request = GenerationRequest(sample["id"], list(group["prompt_ids"]),
                                            SamplingParams(**self.sampling, seed=sample["seed"]))
                self.pending[sample["id"]] = (group, k)
                self.engine.add_request(request)
            self.left[group["index"]] = len(group["samples"])
            self.num_groups += 1
            self.arrived.set()

    async def drive(self, fetch: asyncio.Future) -> None:
        while not (fetch.done() and not self.engine.has_work()):
            if fetch.done() and fetch.exception() is not None:
                raise fetch.exception()
            if not self.engine.has_work():
                self.arrived.clear()
                waiter = asyncio.ensure_future(self.arrived.wait())
                await asyncio.wait([fetch, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            for result in await self.engine.step():
                await self._finished(result)
            self.num_steps += 1
            await asyncio.sleep(0)  # lets fetch add newly arrived prompts between steps
        fetch.result()
        if self.ready:
            await self._emit()
        await self.outbox.flush()

    async def _finished(self, result: GenerationResult) -> None:
        group, k = self.pending.pop(result.request_id)
        group["samples"][k].update(output_ids=result.output_token_ids, logprobs=result.output_logprobs,
                                   finish=result.finish_reason, version=result.weight_version)
        self.num_tokens += len(result.output_token_ids)
        self.left[group["index"]] -= 1
        if self.left[group["index"]] == 0:
            self.ready.append(group)
            if len(self.ready) >= self.chunk_size:
                await self._emit()

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.outbox.put(chunk, weight=len(chunk))
