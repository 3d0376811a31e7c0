"""Configuration of the emulated rollout engine."""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.components.costmodel import (DEFAULT_MEM_UTIL, DeviceSpec, ModelShape, get_device,
                                         get_model, kv_capacity_tokens)
from dynarl.core.config_tree import wire_config


@wire_config(23)
@dataclass(kw_only=True, slots=True)
class EmulatedRolloutConfig:
    model: str = "qwen2.5-7b"
    """A key of costmodel.MODELS."""
    device: str = "h100-80gb"
    """A key of costmodel.DEVICES."""
    tp: int = 1
    """Tensor-parallel degree of the instance (devices per engine)."""
    mem_util: float = DEFAULT_MEM_UTIL
    """Fraction of device memory the engine claims (sets the KV capacity)."""
    kv_capacity_tokens: int | None = None
    """Overrides the cost model's KV capacity (tests, what-if runs). None = computed."""
    max_num_seqs: int = 1024
    """Most requests decoded at once [E: vLLM's max_num_seqs / SGLang's max_running_requests]."""
    max_prefill_tokens: int = 16384
    """Prompt tokens prefilled per step [E: vLLM max_num_batched_tokens / SGLang
    chunked_prefill_size are 8k-16k]. A longer prompt is admitted alone, unchunked."""
    block_size: int = 16
    """Prefix-cache granularity in tokens (vLLM's default block size)."""
    enable_prefix_cache: bool = True
    coalesce_steps: bool = True
    """Run the iterations between events (finish, preemption, admission, outside calls)
    in one sleep; results and timings equal step-by-step. False: one iteration per step()."""
    time_scale: float = 1.0
    """Real sleeps are cost-model seconds times this (1.0 under the virtual-time loop;
    e.g. 0.01 for a fidelity check on a real loop)."""
    weight_sync_bandwidth: float | None = None
    """Bytes/s each TP rank receives weights at; None = the device's link bandwidth."""
    queue: str = "fifo"
    """Waiting-queue order: "fifo" (arrival, then admission order) or "priority", DynaRL's
    (tool_count, cached_prefix) key with a bounded overtaking window: the same key function
    as the native engine (components/rollout/queue_keys.py over core/priority.py)."""
    priority_window_s: float = 30.0
    """priority: core.priority.PriorityConfig.max_bonus_s, in the requests' arrival_time unit."""
    lazy_outputs: bool = False
    """Results hold output ids and log-probs as tokens.LazyList, built on first read:
    same values, but a simulation that only needs lengths skips building them. Such
    results must be materialized (list()) before they are sent over the wire."""

    def __post_init__(self) -> None:
        get_model(self.model)  # raises ValueError naming the known ones
        get_device(self.device)
        if self.tp < 1:
            raise ValueError(f"tp must be >= 1, got {self.tp}")
        if not 0 < self.mem_util <= 1:
            raise ValueError(f"mem_util must be in (0, 1], got {self.mem_util}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise ValueError(f"kv_capacity_tokens must be >= 1, got {self.kv_capacity_tokens}")
        for name in ("max_num_seqs", "max_prefill_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, got {self.time_scale}")
        if self.weight_sync_bandwidth is not None and self.weight_sync_bandwidth <= 0:
            raise ValueError(f"weight_sync_bandwidth must be > 0, got {self.weight_sync_bandwidth}")
        if self.queue not in ("fifo", "priority"):
            raise ValueError(f"queue must be 'fifo' or 'priority', got {self.queue!r}")
        if self.priority_window_s < 0:
            raise ValueError(f"priority_window_s must be >= 0, got {self.priority_window_s}")
        if self.capacity_tokens() < 1:
            raise ValueError(f"{self.model} at tp={self.tp} does not fit on {self.device} "
                             f"(mem_util={self.mem_util}): no room for KV cache")

    @property
    def model_shape(self) -> ModelShape:
        return get_model(self.model)

    @property
    def device_spec(self) -> DeviceSpec:
        return get_device(self.device)

    def capacity_tokens(self) -> int:
        if self.kv_capacity_tokens is not None:
            return self.kv_capacity_tokens
        return kv_capacity_tokens(self.model_shape, self.device_spec, self.tp, self.mem_util)
