"""The contract every trainer backend meets (native, megatron, emulated), as the
trainer worker and the P2P reshard see it."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping, Protocol

from dynarl.components.trainer.base import StateLayout, TrainBatch, TrainerConfig
from dynarl.components.trainer.metrics import TrainMetrics

if TYPE_CHECKING:
    from dynarl.components.trainer.megatron.layout import ShardedLayout


class TrainerEngine(Protocol):
    """The contract every trainer backend meets (one instance per data-parallel rank),
    as the trainer worker and the P2P reshard see it. Calls that compute, communicate
    or do I/O are coroutines: the blocking torch engines (native, megatron) are
    wrapped in threaded.ThreadedTrainer, the emulated one spends cost-model time on
    the loop. Methods marked collective must be called on every rank of the group."""

    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def global_step(self) -> int:
        """Optimizer steps taken (a checkpoint's or an imported shard's on load)."""
    @property
    def dp_rank(self) -> int:
        """Data-parallel rank (tensor-parallel ranks of one DP rank share a part)."""
    @property
    def dp_size(self) -> int: ...
    @property
    def needs_token_ids(self) -> bool:
        """False: the engine reads only lengths (emulated), so batches may carry ranges."""

    async def train_step(self, batch: TrainBatch, config: TrainerConfig | None = None) -> TrainMetrics:
        """Collective. One optimizer step on this rank's part of the global batch (with
        `config` instead of the engine's own, e.g. the warm start's). Returns the step's
        global metrics."""
    async def begin_stream(self) -> None:
        """Collective. Streaming: ready the engine for a step's parts (the native
        trainer gathers its weights once, so `accumulate` needs no collective)."""
    async def accumulate(self, batch: TrainBatch) -> None:
        """Streaming: forward/backward of one part of this step's batch (its advantages
        precomputed), added to the gradients. Not collective: ranks take parts as they come."""
    async def apply(self) -> TrainMetrics:
        """Collective. The optimizer step over everything accumulated since the last one:
        the token-mean loss of the whole step, as train_step on the same samples."""
    async def values(self, batch: TrainBatch) -> list[list[float]] | None:
        """A critic's values per response token of this rank's part (None: an emulated
        critic's, lengths only). Not collective."""
    def layout(self) -> StateLayout | ShardedLayout:
        """Where the state lives: flat ranges (emulated) or boxes (native FSDP2, megatron)."""
    def export_state_shard(self) -> dict[str, Any]:
        """This rank's part of the state (the layout's ranges or boxes), plus 'step'."""
    async def import_state_shard(self, shard: Mapping[str, Any]) -> None:
        """Collective. Install an exported shard laid out for this rank."""
    def weight_stream(self, bucket_bytes: int) -> Iterator[tuple[str, Any]]:
        """Full weights for the rollout engines, (HF name, tensor) in the native model's
        order, made as they are taken (blocking: consume it in a thread; collective over
        megatron's TP group, every TP rank consumes it). Emulated: (name, num_bytes)."""
    async def save_checkpoint(self, path: str) -> None:
        """Collective. Each rank writes its shard; rank 0 the metadata."""
    async def load_checkpoint(self, path: str) -> None:
        """Collective. Works across world sizes (re-slices the shards)."""
    async def onload(self) -> None: ...
    async def offload(self) -> None: ...
    @property
    def is_onloaded(self) -> bool:
        """Whether its state is on the device."""
    @property
    def frees_offloaded_state(self) -> bool:
        """Offloaded, its state cannot be read (megatron frees the device storage): reads
        outside the device_lock onload it first (trainer/residency.py). A native trainer's
        offloaded state is in host memory and read from there."""
    async def close(self) -> None:
        """Let go of what the engine holds in the process beyond its tensors (megatron:
        its parallel state), so a later engine there may take another layout."""
