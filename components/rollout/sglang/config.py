"""Settings of one SGLang engine (one per rollout worker), checked without sglang
installed, and the keyword arguments for `sglang.Engine(**kwargs)`.

Field names and rules follow sglang 0.5.23 (docs/BACKENDS.md A2, A9)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any
from dynarl.core.config_tree import wire_config

POLICIES = ("fcfs", "lof", "random", "routing-key", "lpm", "dfs-weight", "hrrn", "shortest-prefill-first")
"""SGLang's schedule policies. "priority" is accepted by its CLI but has no enum: the
scheduler raises on it, so it is refused here."""
PRIORITY_POLICIES = ("fcfs", "lof")
"""The only policies under which per-request priority takes effect."""
MEMORY_TAGS = ("kv_cache", "weights", "cuda_graph")
"""What SGLang's release/resume_memory_occupation take (srt/constants.py)."""


@wire_config(24)
@dataclass(kw_only=True, slots=True)
class SGLangConfig:
    model_path: str | None = None
    """HF folder of the model the engine serves (the architecture and tokenizer come
    from here; the trainer's weights replace its weights). None: the job's model.path."""
    tp_size: int = 1
    base_gpu_id: int = 0
    """First GPU of this engine on its node; TP rank i runs on base_gpu_id + i."""
    mem_fraction_static: float | None = None
    """GPU memory fraction for weights + KV cache; None lets SGLang choose. Lower it when
    a trainer shares the GPUs (colocated, device_lock)."""
    enable_memory_saver: bool = True
    """Needed by release_memory()/resume_memory() (device_lock)."""
    enable_weights_cpu_backup: bool = False
    """Keep the weights across release/resume; without it the trainer must push them again."""
    schedule_policy: str = "fcfs"
    enable_priority_scheduling: bool = False
    """Per-request priority (the runtime's queue key) reaches SGLang only with this on."""
    disable_radix_cache: bool = False
    max_running_requests: int | None = None
    random_seed: int | None = None
    server_args: dict[str, Any] = field(default_factory=dict)
    """Other sglang ServerArgs fields, passed through unchecked."""
    offload_tags: list[str] = field(default_factory=lambda: ["kv_cache", "cuda_graph"])
    """What release_memory()/resume_memory() free and restore when called without tags
    (the rollout worker's device_lock offload/onload). The weights stay, as the native
    engine's do, so a weight sync can reach a rank that is off the device."""
    weight_bucket_bytes: int = 512 << 20
    """update_weights() pushes the tensors it is given in buckets of at most this many
    bytes (one flattened buffer per bucket and TP rank is what SGLang holds at once)."""
    abort_retry_s: float = 1.0
    """export_inflight() repeats abort-all at this period until every request is back (a
    request still being tokenized can miss one abort, as in SGLang's own pause)."""

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise ValueError(f"mem_fraction_static must be in (0, 1), got {self.mem_fraction_static}")
        if self.schedule_policy not in POLICIES:
            raise ValueError(f"schedule_policy must be one of {POLICIES}, got {self.schedule_policy!r}")
        if self.enable_priority_scheduling and self.schedule_policy not in PRIORITY_POLICIES:
            raise ValueError(f"enable_priority_scheduling needs schedule_policy in {PRIORITY_POLICIES}, "
                             f"got {self.schedule_policy!r}")
        self.offload_tags = list(self.offload_tags)
        if not self.offload_tags or set(self.offload_tags) - set(MEMORY_TAGS):
            raise ValueError(f"offload_tags must be a non-empty subset of {MEMORY_TAGS}, got {self.offload_tags}")
        if self.weight_bucket_bytes < 1:
            raise ValueError(f"weight_bucket_bytes must be >= 1, got {self.weight_bucket_bytes}")
        if self.abort_retry_s <= 0:
            raise ValueError(f"abort_retry_s must be > 0, got {self.abort_retry_s}")
        clash = set(self.server_args) & set(self.engine_kwargs(include_extra=False))
        if clash:
            raise ValueError(f"server_args repeats fields set above: {sorted(clash)}")

    def engine_kwargs(self, include_extra: bool = True) -> dict[str, Any]:
        if include_extra and not self.model_path:
            raise ValueError("model_path is not set (fill it from the job's model.path)")
        kwargs: dict[str, Any] = {
            "model_path": self.model_path, "tp_size": self.tp_size, "base_gpu_id": self.base_gpu_id,
            "enable_memory_saver": self.enable_memory_saver,
            "enable_weights_cpu_backup": self.enable_weights_cpu_backup,
            "schedule_policy": self.schedule_policy, "enable_priority_scheduling": self.enable_priority_scheduling,
            "disable_radix_cache": self.disable_radix_cache,
            # we send token ids and read output_ids: no detokenizer work, no text
            "skip_tokenizer_init": True,
        }
        for name in ("mem_fraction_static", "max_running_requests", "random_seed"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if include_extra:
            kwargs.update(self.server_args)
        return kwargs


CPU_SERVER_ARGS: dict[str, Any] = {"device": "cpu", "attention_backend": "torch_native",
                                   "disable_overlap_schedule": True}
"""SGLang's CPU engine (SGLANG_USE_CPU_ENGINE=1, set by the engine's start): the
attention backend that needs no CUDA kernels; the overlap scheduler is CUDA-only."""


def for_device(config: SGLangConfig, device_kind: str, dtype: str) -> SGLangConfig:
    """`config` for an engine on a `device_kind` device ("cuda" or "cpu") serving `dtype`
    (the dtype the trainer's weights arrive in): on a CPU, CPU_SERVER_ARGS and no memory
    saver (torch_memory_saver is CUDA-only). Fields the user gave in server_args win."""
    extra = {"dtype": dtype, **(CPU_SERVER_ARGS if device_kind == "cpu" else {}), **config.server_args}
    saver = config.enable_memory_saver and device_kind != "cpu"
    return dataclasses.replace(config, server_args=extra, enable_memory_saver=saver)
