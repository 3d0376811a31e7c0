"""Settings of the megatron-core trainer that the shared TrainerConfig lacks:
parallel layout, dtypes, and what only a GPU run wants. Plain data, no megatron
import, so a config file is validated where the extra is not installed."""
from __future__ import annotations

from dataclasses import dataclass
from dynarl.core.config_tree import wire_config

DTYPES = ("float32", "bfloat16")
OPTIMIZERS = ("megatron", "adamw")


@wire_config(27)
@dataclass(kw_only=True, slots=True)
class MegatronConfig:
    tensor_parallel_size: int = 1
    """Must divide num_key_value_heads, vocab_size, intermediate_size and hidden_size."""
    pipeline_parallel_size: int = 1
    """Only 1 is implemented for training (layout() and resharding handle any value)."""
    dtype: str = "bfloat16"
    """Model weights; the optimizer keeps fp32 main params either way."""
    use_distributed_optimizer: bool = True
    """Megatron's ZeRO-1: Adam state and fp32 main params sharded over data parallel."""
    grad_reduce_in_fp32: bool = True
    use_cpu_initialization: bool = False
    """Build the weights on the CPU (needed where there is no GPU; the tests set it)."""
    ddp_bucket_size: int | None = None
    """Elements per gradient bucket; None lets megatron choose."""
    seed: int = 1234
    """Seeds megatron's model-parallel RNG tracker (model_parallel_cuda_manual_seed)."""
    optimizer: str = "megatron"
    """"megatron": megatron-core's optimizer (GPU only: it allocates on "cuda"), its
    state exported by core_optimizer.py. "adamw": dynarl's AdamW (the native trainer's
    arithmetic) on each rank's local parameters, reading DDP's reduced main_grad; it
    runs on CPU. Needs dtype float32 and no distributed optimizer. Both optimizers'
    state is resharded live and saved in checkpoints."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.pipeline_parallel_size != 1:
            raise ValueError("pipeline_parallel_size > 1 is not implemented for training yet")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.optimizer == "adamw" and (self.dtype != "float32" or self.use_distributed_optimizer):
            raise ValueError("optimizer 'adamw' needs dtype 'float32' and use_distributed_optimizer false "
                             f"(got dtype {self.dtype!r}, use_distributed_optimizer {self.use_distributed_optimizer})")
        if self.ddp_bucket_size is not None and self.ddp_bucket_size < 1:
            raise ValueError(f"ddp_bucket_size must be >= 1, got {self.ddp_bucket_size}")
