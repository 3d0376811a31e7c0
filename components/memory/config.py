"""The `memory` section of `dynarl train`: what the memory plan assumes and whether
a plan over a device's memory stops the launch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True)
class MemorySection:
    prompt_tokens: int = 1024
    """Prompt length the plan assumes: activations are planned for sequences of
    prompt_tokens + rollout.max_new_tokens (at most the model's positions)."""
    check: bool = True
    """Refuse to start (exit 2) when a device's planned peak exceeds its memory
    (runtime.cluster.device_memory_gb); false: print the plan only."""

    def __post_init__(self) -> None:
        if isinstance(self.prompt_tokens, bool) or not isinstance(self.prompt_tokens, int) or self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be an integer >= 1, got {self.prompt_tokens!r}")
