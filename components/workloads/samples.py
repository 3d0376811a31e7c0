"""What a workload hands the simulator: prompt groups with lengths, no tokens.

A single-turn sample has `response_tokens`; a multi-turn (agentic) sample has
`turns`: generate `gen_tokens`, wait `tool_latency_s` for the tool, append
`obs_tokens` of tool output, and continue. The wire form is plain lists/dicts
(msgpack-safe), which is what travels on the simulator's channels.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Turn:
    gen_tokens: int
    tool_latency_s: float
    obs_tokens: int


@dataclass(frozen=True, slots=True)
class SampleSpec:
    """A sample's lengths, no tokens (components/experience.py Sample is the sample a
    run trains on)."""
    sample_id: str
    response_tokens: int = 0
    """Single-turn: tokens to generate."""
    turns: tuple[Turn, ...] = ()
    """Multi-turn: empty for single-turn samples."""

    @property
    def is_multi_turn(self) -> bool:
        return bool(self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(t.gen_tokens for t in self.turns) if self.turns else self.response_tokens

    def sequence_tokens(self, prompt_tokens: int) -> int:
        """Length of the trained sequence: prompt, every generation and tool output."""
        if self.turns:
            return prompt_tokens + sum(t.gen_tokens + t.obs_tokens for t in self.turns)
        return prompt_tokens + self.response_tokens


@dataclass(frozen=True, slots=True)
class Group:
    """One prompt and its samples (the GRPO group)."""
    prompt_id: str
    prompt_tokens: int
    samples: tuple[SampleSpec, ...]


Sample = SampleSpec
"""The old name, kept for tests/test_engine_spread.py until it imports SampleSpec."""
