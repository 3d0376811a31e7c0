"""`model.lora`: low-rank adapters (LoRA) for the native trainer's policy.

Plain data, no torch (it is part of ModelSpec, which every process loads). rank 0
means off: the whole model trains. The layer and its merge are in lora.py.
"""
from __future__ import annotations

from dataclasses import dataclass

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
"""The nn.Linear modules of the native model (qwen2.py), by their last name: what
target_modules can name."""


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """Low-rank adapters: with rank > 0 the native trainer trains only an adapter pair
    per target linear layer (the base weights stay frozen); the rollout engines get the
    merged weights, and `dynarl export` also writes the adapter in PEFT's format."""
    rank: int = 0
    """Adapter rank r (0 = off: the whole model trains)."""
    alpha: float = 16.0
    """Scale numerator: the adapter's output is multiplied by alpha / rank (PEFT's lora_alpha)."""
    dropout: float = 0.0
    """Dropout on the adapter's input while training (PEFT's lora_dropout)."""
    target_modules: tuple[str, ...] = LINEAR_NAMES
    """The linear layers that get adapters, by their last name (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj, lm_head); every layer of each name gets one. The default is every one, the output head included
    (left out where it is tied to the embeddings); PEFT's "all-linear" leaves the head out: list the other
    seven for that (on the built-in task the head's adapter is what lifts the reward: docs/benchmarks.md)."""

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"rank must be an integer >= 0 (0 = off), got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        self.target_modules = tuple(self.target_modules)
        if not self.target_modules:
            raise ValueError("target_modules must name at least one linear layer")
        unknown = [name for name in self.target_modules if name not in LINEAR_NAMES]
        if unknown:
            raise ValueError(f"target_modules {unknown[0]!r} is no linear layer of the model; "
                             f"choose from {', '.join(LINEAR_NAMES)}")
        if len(set(self.target_modules)) != len(self.target_modules):
            raise ValueError(f"target_modules names a layer twice: {list(self.target_modules)}")

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        """alpha / rank: the factor on the adapter's output (and on B @ A when merged)."""
        return self.alpha / self.rank if self.rank > 0 else 0.0
