"""What megatron-core cannot build, checked on a model's config alone (no torch: the
controller checks a config at load, components/backends.py)."""
from __future__ import annotations

from dynarl.components.model.config import ModelConfig


def check_tp_divisible(config: ModelConfig, tp_size: int) -> None:
    """Raise ValueError when a dimension TP must cut evenly is not a multiple of tp_size."""
    for what, n in (("num_key_value_heads", config.num_key_value_heads), ("vocab_size", config.vocab_size),
                    ("intermediate_size", config.intermediate_size), ("hidden_size", config.hidden_size)):
        if n % tp_size:
            raise ValueError(f"tensor_parallel_size={tp_size} must divide {what}={n}")


MEGATRON_ROPE_LLAMA3 = (1.0, 4.0, 8192)
"""The (low_freq_factor, high_freq_factor, original_max_position_embeddings) that
megatron-core's RotaryEmbedding._apply_scaling fixes (only the factor is a
parameter); every released Llama 3.x config uses them."""


def rope_scaling_problem(model: ModelConfig) -> str | None:
    """Why megatron cannot build this model's RoPE, or None."""
    if model.rope_llama3 is None:
        return None
    factor, low, high, original = model.rope_llama3
    if (float(low), float(high), int(original)) != MEGATRON_ROPE_LLAMA3:
        return (f"megatron-core's llama3 RoPE scaling fixes low_freq_factor, high_freq_factor, "
                f"original_max_position_embeddings = {MEGATRON_ROPE_LLAMA3}; this model has "
                f"{(low, high, original)} (trainer.backend=native trains it)")
    return None
