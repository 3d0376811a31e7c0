"""What a rank reports to the scheduler's poll (ReportingRank.metrics), as a
registered wire record (its fields numbers): each role fills what it knows, the rest
keeps its default."""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.transport.wire import register_struct


@register_struct(58, numbers=True)
@dataclass(kw_only=True, slots=True)
class RankReport:
    utilization: float = 0.0
    """A rollout engine's KV fill (active KV tokens / capacity: the DynaRL signal); a
    trainer's 1.0 while it trains."""
    admitting: bool = False
    """A rollout rank that may still be handed prompts (it has not taken its END)."""
    running: int = 0
    waiting: int = 0
    kv: int = 0
    """Active KV tokens, of `capacity` (one engine's)."""
    capacity: int = 0
    generated: int = 0
    """Output tokens its held requests made so far."""
    finished: int = 0
    finished_tokens: int = 0
    """Requests finished in this step's generation, and their output tokens."""
    active_run: bool = False
    step_s: float = 0.0
    """Its mean engine step so far this step (0: none yet)."""
    moved_token_s: float = 0.0
    """What a token of a request moved here costs it (0: not known)."""
    work_done: float = 0.0
    """Output tokens it made since it started."""
    samples: int = 0
    tokens: int = 0
    """A stage rank's samples and their sequence tokens processed this step."""
