"""One turn of a multi-turn episode as it crosses to a rollout rank ("turns" channel,
keyed by rank) and back ("turn_results"): registered wire records (transport/wire.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynarl.transport.wire import register_struct


@register_struct(73)
@dataclass(kw_only=True, slots=True)
class TurnRequest:
    """What the episode driver asks of a rank."""
    id: str
    """'<episode id>#<turn>'."""
    prompt_ids: list[int]
    """The episode's whole context so far."""
    seed: int
    tool_count: int
    """The priority's tool_count (the episode's calls, or an agent session's turns, so far)."""
    max_new_tokens: int
    partial: list | None = None
    """The rest of a turn a closed step cut: [its tokens so far, their log-probs]."""
    kv: list | None = None
    """The KV of the context a leaving rank offered: [[tokens, KV or its RemoteRef]]."""
    node: Any = None
    """The node that KV is on."""


@register_struct(74)
@dataclass(kw_only=True, slots=True)
class TurnResult:
    """A finished turn, with the rank that served it and that engine's KV load after it
    (the router's)."""
    id: str
    output_ids: list[int]
    logprobs: list[float]
    finish: str
    version: int
    """The weight version that made its tokens."""
    cached_tokens: int
    """Prompt tokens the serving engine's prefix cache supplied."""
    wait_s: float
    """How long it waited for admission (engine seconds)."""
    rank: Any = None
    kv_utilization: float | None = None
    kv_capacity: float | None = None
