"""EmulatedTrainer: the trainer contract with sizes instead of tensors, time from the cost model.

One instance is one data-parallel rank of a ZeRO-1 group, with the native
trainer's StateLayout (same parameter names, shapes and owned ranges). Its state
shards are sizes: {state: {"start", "end", "numel", "nbytes"}} plus "step", so
a P2P reshard moves the same byte counts a real one would. Weights for rollout
come as buckets of (name, num_bytes) that EmulatedRolloutEngine.update_weights
accepts.

It meets the async TrainerEngine contract (base.py) directly: train_step and
accumulate sleep train_time() on the running loop; onload and offload are half a
role switch each (docs/COSTMODEL.md §3). Differences from the native trainer, all
because there is no computation:
- Loss metrics are 0.0; `tokens` counts this rank's loss tokens (native: global),
  and `time_s` is the cost-model time of the step (TrainMetrics).
- Ranks never talk: a collective step's wait for the slowest rank is the caller's
  gather over ranks. Gradient reduce-scatter / all-gather time is taken as part of
  the MFU rather than modelled separately.
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from dynarl.components import costmodel
from dynarl.components.trainer.base import STATE_NAMES, StateLayout, TrainBatch, TrainerConfig
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.core.files import atomic_open

from dynarl.components.trainer.emulated.layout import build_layout
from dynarl.core.config_tree import wire_config

MASTER_ITEMSIZE = 4
"""fp32 master weights, AdamW moments and reduced gradients (as the native trainer)."""
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FORMAT_VERSION = 1


@wire_config(26)
@dataclass(kw_only=True, slots=True)
class EmulatedTrainerConfig:
    model: str = "qwen2.5-7b"
    """A key of costmodel.MODELS."""
    device: str = "h100-80gb"
    """A key of costmodel.DEVICES."""
    mfu: float = costmodel.DEFAULT_MFU
    recompute: bool = False
    """Full activation recompute: 3/4 of the training rate."""
    param_dtype: str = "bfloat16"
    """Dtype of the full model weights each rank holds (and sends to rollout)."""
    time_scale: float = 1.0
    """Real sleeps are cost-model seconds times this."""

    def __post_init__(self) -> None:
        costmodel.get_model(self.model)
        costmodel.get_device(self.device)
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu}")
        if self.param_dtype not in _DTYPE_BYTES:
            raise ValueError(f"param_dtype must be one of {sorted(_DTYPE_BYTES)}, got {self.param_dtype!r}")
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")


class EmulatedTrainer:
    frees_offloaded_state = False
    """(trainer/engine.py TrainerEngine)"""
    needs_token_ids = False
    """Only lengths are read: a batch's input_ids may be ranges."""

    def __init__(self, config: TrainerConfig | None = None, *, emulation: EmulatedTrainerConfig | None = None,
                 rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        self.config = config or TrainerConfig()
        self.emulation = emulation or EmulatedTrainerConfig()
        self.model = costmodel.get_model(self.emulation.model)
        self.device = costmodel.get_device(self.emulation.device)
        self.rank = rank
        self.world_size = world_size
        self.global_step = 0
        self._layout = build_layout(self.model, world_size, self.emulation.param_dtype)
        self._start, self._end = self._layout.owned("master", rank)
        self._onloaded = True
        self.busy_time = 0.0
        self._accumulated = 0
        """Loss tokens accumulated since the last apply()."""

    @property
    def dp_rank(self) -> int:
        return self.rank

    @property
    def dp_size(self) -> int:
        return self.world_size

    @property
    def weight_bytes(self) -> int:
        return self._layout.total_numel * _DTYPE_BYTES[self.emulation.param_dtype]

    @property
    def state_bytes(self) -> int:
        """This rank's sharded fp32 state (master, two moments, gradient)."""
        return len(STATE_NAMES) * (self._end - self._start) * MASTER_ITEMSIZE

    # ---- training ---------------------------------------------------------------

    async def train_step(self, batch: TrainBatch, config: TrainerConfig | None = None) -> TrainMetrics:
        """One optimizer step on this rank's part of the batch: sleeps train_time over
        its prompt + response tokens, with the token-weighted mean sequence length
        (attention cost grows with each sequence's own length)."""
        dt = await self._forward_backward(batch, config or self.config)
        self.global_step += 1
        return self._metrics(batch.num_loss_tokens(), dt)

    async def begin_stream(self) -> None:
        """Nothing to gather: the emulated step's time is its forward/backward and apply."""

    async def accumulate(self, batch: TrainBatch) -> None:
        """Streaming: one part's forward/backward time; the step comes with apply()."""
        self._accumulated += batch.num_loss_tokens()
        await self._forward_backward(batch, self.config)

    async def apply(self) -> TrainMetrics:
        """The optimizer step over what was accumulated. Its time (the gradient
        reduction, the AdamW update) is folded into the MFU, as train_step's."""
        tokens, self._accumulated = self._accumulated, 0
        self.global_step += 1
        return self._metrics(tokens, 0.0)

    async def values(self, batch: TrainBatch) -> None:
        """A critic's values: the forward pass's time over this rank's part (a third of a
        training step's FLOPs, as a log-prob pass), and no values (lengths only)."""
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before values()")
        seq_lens = [len(ids) for ids in batch.input_ids]
        tokens = sum(seq_lens)
        if tokens:
            e = self.emulation
            dt = costmodel.logprob_time(self.model, self.device, tokens, sum(n * n for n in seq_lens) / tokens, 1,
                                        e.mfu)
            self.busy_time += dt
            await asyncio.sleep(dt * e.time_scale)
        return None

    async def _forward_backward(self, batch: TrainBatch, config: TrainerConfig) -> float:
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before train_step()")
        if config.kl_coef > 0 and batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs batch.ref_logprobs")
        if batch.num_loss_tokens() == 0:
            raise ValueError("the batch has no response tokens with mask 1")
        dt = self.step_time([len(ids) for ids in batch.input_ids])
        self.busy_time += dt
        await asyncio.sleep(dt * self.emulation.time_scale)
        return dt

    def _metrics(self, loss_tokens: int, dt: float) -> TrainMetrics:
        return TrainMetrics(loss=0.0, grad_norm=0.0, tokens=loss_tokens, step=self.global_step, time_s=dt)

    def step_time(self, seq_lens: list[int]) -> float:
        tokens = sum(seq_lens)
        if not tokens:
            return 0.0
        mean_len = sum(n * n for n in seq_lens) / tokens
        e = self.emulation
        return costmodel.train_time(self.model, self.device, tokens, mean_len, 1, e.mfu, e.recompute)

    # ---- state ------------------------------------------------------------------

    def layout(self) -> StateLayout:
        return self._layout

    def export_state_shard(self) -> dict[str, Any]:
        size = self._end - self._start
        shard: dict[str, Any] = {name: {"start": self._start, "end": self._end, "numel": size,
                                        "nbytes": size * MASTER_ITEMSIZE} for name in STATE_NAMES}
        shard["step"] = self.global_step
        return shard

    async def import_state_shard(self, shard: Mapping[str, Any]) -> None:
        size = self._end - self._start
        for name in (*STATE_NAMES, "step"):
            if name not in shard:
                raise ValueError(f"state shard lacks {name!r}")
        for name in STATE_NAMES:
            if shard[name]["numel"] != size:
                raise ValueError(f"state shard {name!r} has {shard[name]['numel']} elements, "
                                 f"rank {self.rank} owns {size}")
        self.global_step = int(shard["step"])

    async def save_checkpoint(self, path: str) -> None:
        """Each rank writes its shard sizes; rank 0 writes meta.json (layout, config, step)."""
        _write_json(os.path.join(path, _shard_file(self.rank, self.world_size)), self.export_state_shard())
        if self.rank == 0:
            meta = {"format_version": FORMAT_VERSION, "emulated": True, "layout": self._layout.to_wire(),
                    "config": self.config.to_wire(), "step": self.global_step}
            _write_json(os.path.join(path, "meta.json"), meta)

    async def load_checkpoint(self, path: str) -> None:
        """Works across world sizes: checks that the old shard files covering this
        rank's range exist, then takes the step."""
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        if meta.get("format_version") != FORMAT_VERSION or not meta.get("emulated"):
            raise ValueError(f"checkpoint {path} was not written by EmulatedTrainer v{FORMAT_VERSION}")
        old = StateLayout.from_wire(meta["layout"])
        if [(p.name, p.shape) for p in old.params] != [(p.name, p.shape) for p in self._layout.params]:
            raise ValueError(f"checkpoint {path} does not match model {self.model.name}")
        for rank, (start, end) in enumerate(old.shards["master"]):
            if start < self._end and self._start < end:
                file = os.path.join(path, _shard_file(rank, old.world_size))
                if not os.path.exists(file):
                    raise FileNotFoundError(f"checkpoint {path} lacks {file}")
        self.global_step = int(meta["step"])

    # ---- weights for rollout; device residency -----------------------------------

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, int]]]:
        """(name, num_bytes) for every parameter in layout order, in buckets of at most
        bucket_bytes (a larger parameter gets a bucket of its own), as the native trainer."""
        if bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
        itemsize = _DTYPE_BYTES[self.emulation.param_dtype]
        bucket: list[tuple[str, int]] = []
        size = 0
        for p in self._layout.params:
            nbytes = p.numel * itemsize
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((p.name, nbytes))
            size += nbytes
        if bucket:
            yield bucket

    def weight_stream(self, bucket_bytes: int) -> Iterator[tuple[str, int]]:
        return (pair for bucket in self.named_weights(bucket_bytes) for pair in bucket)

    async def offload(self) -> None:
        self._onloaded = False
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.emulation.time_scale)

    async def onload(self) -> None:
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.emulation.time_scale)
        self._onloaded = True

    async def close(self) -> None:
        """Nothing beyond its (emulated) tensors."""

    @property
    def is_onloaded(self) -> bool:
        return self._onloaded


def full_state_bytes(emulation: EmulatedTrainerConfig) -> int:
    """The whole trainer's state: fp32 master weights, two Adam moments and the
    gradient, plus the weights in their own dtype (what a P2P move carries)."""
    numel = build_layout(costmodel.get_model(emulation.model), 1, emulation.param_dtype).total_numel
    return numel * (len(STATE_NAMES) * MASTER_ITEMSIZE + costmodel.BYTES_PER_PARAM)


def _shard_file(rank: int, world_size: int) -> str:
    return f"shard-{rank:05d}-of-{world_size:05d}.json"


def _write_json(file: str, value: Any) -> None:
    os.makedirs(os.path.dirname(file), exist_ok=True)
    with atomic_open(file) as f:
        json.dump(value, f)
