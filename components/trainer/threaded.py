"""A blocking trainer engine (native torch, megatron-core) behind the async
TrainerEngine contract (base.py): each call that computes, communicates or does
I/O runs in a thread, so the worker's event loop keeps serving (heartbeats,
channels) while torch works."""
from __future__ import annotations

import asyncio
from typing import Any, Iterator, Mapping

from .base import StateLayout, TrainBatch, TrainerConfig


class ThreadedTrainer:
    needs_token_ids = True

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        """The blocking engine (NativeTrainer or MegatronTrainer)."""

    @property
    def rank(self) -> int:
        return self.engine.rank

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    @property
    def global_step(self) -> int:
        return self.engine.global_step

    @property
    def dp_rank(self) -> int:
        return getattr(self.engine, "dp_rank", self.engine.rank)

    @property
    def dp_size(self) -> int:
        return getattr(self.engine, "dp_size", self.engine.world_size)

    async def train_step(self, batch: TrainBatch, config: TrainerConfig | None = None) -> dict[str, float]:
        return await asyncio.to_thread(self._with_config, config, self.engine.train_step, batch)

    async def accumulate(self, batch: TrainBatch) -> None:
        await asyncio.to_thread(self.engine.accumulate, batch)

    async def apply(self) -> dict[str, float]:
        return await asyncio.to_thread(self.engine.apply)

    def _with_config(self, config: TrainerConfig | None, fn: Any, *args: Any) -> Any:
        if config is None:
            return fn(*args)
        saved, self.engine.config = self.engine.config, config
        try:
            return fn(*args)
        finally:
            self.engine.config = saved

    async def values(self, batch: TrainBatch) -> list[list[float]]:
        """A critic's values per response token (trainer/native/critic.py)."""
        return await asyncio.to_thread(self.engine.values, batch)

    def layout(self) -> StateLayout:
        return self.engine.layout()

    def export_state_shard(self) -> dict[str, Any]:
        return self.engine.export_state_shard()

    async def import_state_shard(self, shard: Mapping[str, Any]) -> None:
        await asyncio.to_thread(self.engine.import_state_shard, shard)

    def weight_stream(self, bucket_bytes: int) -> Iterator[tuple[str, Any]]:
        return (pair for bucket in self.engine.named_weights(bucket_bytes) for pair in bucket)

    async def save_checkpoint(self, path: str) -> None:
        await asyncio.to_thread(self.engine.save_checkpoint, path)

    async def load_checkpoint(self, path: str) -> None:
        await asyncio.to_thread(self.engine.load_checkpoint, path)

    async def close(self) -> None:
        """Release what the engine holds in this process beyond its tensors (megatron's
        parallel state and default group)."""
        close = getattr(self.engine, "close", None)
        if close is not None:
            await asyncio.to_thread(close)

    async def onload(self) -> None:
        await asyncio.to_thread(self.engine.onload)  # (megatron's moves: off the event loop)

    @property
    def is_onloaded(self) -> bool:
        return self.engine.is_onloaded

    @property
    def frees_offloaded_state(self) -> bool:
        return self.engine.frees_offloaded_state

    async def offload(self) -> None:
        await asyncio.to_thread(self.engine.offload)
