"""The native rollout engine's settings (`rollout.engine`): a wire record, no torch (the
controller builds it)."""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.core.config_tree import wire_config


@wire_config(21)
@dataclass(kw_only=True, slots=True)
class NativeEngineConfig:
    block_size: int = 16
    """Tokens per KV block (also the prefix-cache granularity)."""
    num_blocks: int = 512
    """KV capacity = num_blocks * block_size tokens."""
    max_num_seqs: int = 128
    """Most requests running at once."""
    max_prefill_tokens: int = 4096
    """Most new tokens in one prefill batch (one longer prompt still runs alone)."""
    max_model_len: int | None = None
    """Longest prompt + output; None: the model's max_position_embeddings."""
    enable_prefix_cache: bool = True
    seed: int = 0
    """Seeds the generator used by requests that carry no seed of their own."""

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_num_seqs", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
