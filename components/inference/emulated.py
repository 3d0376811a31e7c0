"""EmulatedInference: the InferenceEngine contract (base.py), timed by the cost model.

A forward-only pass over prompt + response tokens costs logprob_time(): one third
of a training step over the same tokens. The values are synthetic but
deterministic: a hash of (sequence tokens, weight version), one per response token,
aligned with TrainBatch.old_logprobs / ref_logprobs. `logprobs` returns them as
LazyLists (built on first read: a simulation that needs only the time never builds
them); `compute_logprobs` builds them. Onload and offload are half a role switch
each (docs/COSTMODEL.md §3), spent on the loop.
"""
from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from dynarl.components import costmodel
from dynarl.components.rollout.emulated.engine import payload_bytes
from dynarl.components.rollout.emulated.tokens import LazyList, response_logprobs
from dynarl.components.trainer.emulated.layout import synced_weight_bytes
from dynarl.core.config_tree import wire_config


@wire_config(25)
@dataclass(kw_only=True, slots=True)
class EmulatedInferenceConfig:
    model: str = "qwen2.5-7b"
    """A key of costmodel.MODELS."""
    device: str = "h100-80gb"
    """A key of costmodel.DEVICES."""
    num_devices: int = 1
    """Devices this instance spreads a batch over."""
    mfu: float = costmodel.DEFAULT_MFU
    time_scale: float = 1.0
    """Real sleeps are cost-model seconds times this."""

    def __post_init__(self) -> None:
        costmodel.get_model(self.model)
        costmodel.get_device(self.device)
        if self.num_devices < 1:
            raise ValueError(f"num_devices must be >= 1, got {self.num_devices}")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {self.mfu}")
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")


class EmulatedInference:
    weights_template = None
    """Weights arrive as a byte count (update_weights), never as tensors."""

    def __init__(self, config: EmulatedInferenceConfig | None = None, weight_version: int = 0):
        self.config = config or EmulatedInferenceConfig()
        self.model = costmodel.get_model(self.config.model)
        self.device = costmodel.get_device(self.config.device)
        self.weight_version = weight_version
        self.busy_time = 0.0
        self._pending_delay = 0.0

    def forward_time(self, seq_lens: Sequence[int]) -> float:
        """Cost-model seconds for one pass over sequences of these lengths; attention uses
        the token-weighted mean length (each token attends over its own sequence)."""
        tokens = sum(seq_lens)
        if not tokens:
            return 0.0
        mean_len = sum(n * n for n in seq_lens) / tokens
        c = self.config
        return costmodel.logprob_time(self.model, self.device, tokens, mean_len, c.num_devices, c.mfu)

    async def logprobs(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                       reference: bool = False) -> list[LazyList]:
        """One pass over prompt + response of each; the values as LazyLists (the
        reference policy's differ: it is the weights before any update)."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        await self.forward([len(p) + len(r) for p, r in zip(prompts, responses)])
        version = -1 if reference else self.weight_version
        return [LazyList(len(r), _synthetic(p, r, version)) for p, r in zip(prompts, responses)]

    async def compute_logprobs(self, input_ids: Sequence[Sequence[int]],
                               prompt_lens: Sequence[int]) -> list[list[float]]:
        """One log-prob per response token of each sequence (input_ids[i][prompt_lens[i]:])."""
        if len(input_ids) != len(prompt_lens):
            raise ValueError(f"{len(input_ids)} sequences but {len(prompt_lens)} prompt lengths")
        for i, (ids, plen) in enumerate(zip(input_ids, prompt_lens)):
            if not 1 <= plen <= len(ids):
                raise ValueError(f"prompt_lens[{i}]={plen} must be in [1, len(input_ids[{i}])={len(ids)}]")
        await self.forward([len(ids) for ids in input_ids])
        return [response_logprobs(self._seed(ids), 0, len(ids) - plen) for ids, plen in zip(input_ids, prompt_lens)]

    async def forward(self, seq_lens: Sequence[int]) -> float:
        """Spends one pass's cost-model time (plus any pending weight sync) on the loop and
        returns it: compute_logprobs without the synthetic values, for simulations that
        need only the time."""
        dt = self.forward_time(seq_lens) + self._pending_delay
        self._pending_delay = 0.0
        self.busy_time += dt
        await asyncio.sleep(dt * self.config.time_scale)
        return dt

    def _seed(self, ids: Sequence[int]) -> int:
        return zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes()) ^ (self.weight_version << 32)

    async def load_reference(self, path: str) -> None:
        """The reference policy is the weights before any update (nothing to read)."""

    async def onload(self) -> None:
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.config.time_scale)

    async def offload(self) -> None:
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.config.time_scale)

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """New policy weights (a byte count, (name, bytes) pairs, or anything = the full
        model); the transfer, split over the instance's devices at the link bandwidth,
        is charged to the next compute_logprobs, as in EmulatedRolloutEngine."""
        self.weight_version = version
        self._pending_delay += costmodel.weight_sync_time(
            payload_bytes(named_tensors, synced_weight_bytes(self.model)), self.device.link_bandwidth,
            self.config.num_devices)


def _synthetic(prompt: Sequence[int], response: Sequence[int], version: int) -> Any:
    def build() -> list[float]:
        ids = list(prompt) + list(response)
        seed = zlib.crc32(np.asarray(ids, dtype=np.int64).tobytes()) ^ ((version & 0xFFFFFFFF) << 32)
        return response_logprobs(seed, 0, len(response))
    return build
