"""A blocking trainer engine (native torch, megatron-core) behind the async
TrainerEngine contract (base.py): each call that computes, communicates or does
I/O runs in a thread, so the worker's event loop keeps serving (heartbeats,
channels) while torch works."""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, TypeVar

from dynarl.components.trainer.base import StateLayout, TrainBatch, TrainerConfig
from dynarl.components.trainer.metrics import TrainMetrics

if TYPE_CHECKING:
    from dynarl.components.trainer.megatron.layout import ShardedLayout

T = TypeVar("T")


class BlockingTrainer(Protocol):
    """What ThreadedTrainer wraps (native/trainer.py NativeTrainer and its critic,
    megatron/trainer.py MegatronTrainer): TrainerEngine's calls, blocking."""

    rank: int
    world_size: int
    global_step: int
    config: TrainerConfig
    """Swapped for one step by train_step's `config`."""
    frees_offloaded_state: bool

    def train_step(self, batch: TrainBatch) -> TrainMetrics: ...
    def begin_stream(self) -> None: ...
    def accumulate(self, batch: TrainBatch) -> None: ...
    def apply(self) -> TrainMetrics: ...
    def layout(self) -> StateLayout | ShardedLayout: ...
    def export_state_shard(self) -> dict[str, Any]: ...
    def import_state_shard(self, shard: Mapping[str, Any]) -> None: ...
    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]: ...
    def save_checkpoint(self, path: str) -> None: ...
    def load_checkpoint(self, path: str) -> None: ...
    def onload(self) -> None: ...
    def offload(self) -> None: ...
    @property
    def is_onloaded(self) -> bool: ...
    def close(self) -> None: ...


class ThreadedTrainer:
    needs_token_ids = True

    def __init__(self, engine: BlockingTrainer) -> None:
        self.engine = engine

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
        dp_rank: int = getattr(self.engine, "dp_rank", self.engine.rank)  # (megatron's; native: its rank)
        return dp_rank

    @property
    def dp_size(self) -> int:
        dp_size: int = getattr(self.engine, "dp_size", self.engine.world_size)
        return dp_size

    async def train_step(self, batch: TrainBatch, config: TrainerConfig | None = None) -> TrainMetrics:
        return await asyncio.to_thread(self._with_config, config, self.engine.train_step, batch)

    async def begin_stream(self) -> None:
        await asyncio.to_thread(self.engine.begin_stream)

    async def accumulate(self, batch: TrainBatch) -> None:
        await asyncio.to_thread(self.engine.accumulate, batch)

    async def apply(self) -> TrainMetrics:
        return await asyncio.to_thread(self.engine.apply)

    def _with_config(self, config: TrainerConfig | None, fn: Callable[[TrainBatch], T], batch: TrainBatch) -> T:
        if config is None:
            return fn(batch)
        saved, self.engine.config = self.engine.config, config
        try:
            return fn(batch)
        finally:
            self.engine.config = saved

    async def values(self, batch: TrainBatch) -> list[list[float]]:
        """A critic's values per response token (trainer/native/critic.py)."""
        values = getattr(self.engine, "values", None)
        if values is None:
            raise TypeError(f"{type(self.engine).__name__} is not a critic: it computes no values")
        result: list[list[float]] = await asyncio.to_thread(values, batch)
        return result

    def layout(self) -> StateLayout | ShardedLayout:
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
        await asyncio.to_thread(self.engine.close)

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
