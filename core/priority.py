"""Queue order for multi-turn (agentic) requests: (tool_count, cached_prefix)
first, with an age term that bounds how long any request can be passed over.

The key is time-invariant, so an engine may compute it once at enqueue:

    key = arrival_time - bonus,  bonus = max_bonus_s * f(tool_count, cached_prefix) in [0, max_bonus_s)

Smaller keys go first. f is lexicographic: more tool calls always weigh more
than any cached prefix (the fraction of the bonus for the prefix stays below one
tool-call step), so requests that arrive together are ordered by
(tool_count, cached_prefix) descending, as DynaRL's Algorithm 2 does.

The bound (tested in tests/test_priority.py): request r can be overtaken only by
requests that arrived less than max_bonus_s after it. A later request s with
a_s >= a_r + max_bonus_s has key_s = a_s - bonus_s > a_r + max_bonus_s - max_bonus_s >= key_r.
So the requests served before r are those already waiting plus those arriving
in a window of max_bonus_s: no starvation, unlike pure (tool_count, prefix) order.
max_bonus_s = 0 is FIFO.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PriorityConfig:
    max_bonus_s: float = 30.0
    """The overtaking window: how much earlier than its arrival a request may be served."""
    max_tool_count: int = 16
    """Tool counts above this all get the full tool part of the bonus."""
    prefix_scale_tokens: int = 1024
    """A cached prefix of this many tokens earns half of one tool-call step."""

    def __post_init__(self) -> None:
        if self.max_bonus_s < 0:
            raise ValueError(f"max_bonus_s must be >= 0, got {self.max_bonus_s}")
        if self.max_tool_count < 1:
            raise ValueError(f"max_tool_count must be >= 1, got {self.max_tool_count}")
        if self.prefix_scale_tokens < 1:
            raise ValueError(f"prefix_scale_tokens must be >= 1, got {self.prefix_scale_tokens}")


def bonus_fraction(tool_count: int, cached_prefix: int, config: PriorityConfig) -> float:
    """f in [0, 1): tool count in whole steps, the cached prefix inside one step."""
    steps = config.max_tool_count + 1
    tools = min(max(tool_count, 0), config.max_tool_count)
    prefix = max(cached_prefix, 0)
    within_step = prefix / (prefix + config.prefix_scale_tokens)  # in [0, 1)
    return (tools + within_step) / steps


def priority_key(arrival_time: float, tool_count: int, cached_prefix: int, config: PriorityConfig) -> float:
    return arrival_time - config.max_bonus_s * bonus_fraction(tool_count, cached_prefix, config)


def fifo_key(arrival_time: float, tool_count: int, cached_prefix: int, config: PriorityConfig | None = None) -> float:
    return arrival_time


@dataclass(slots=True)
class TurnLengths:
    """The order's assumption, checked on the turns an engine finished. The priority
    serves turns of episodes with more tool calls first because later turns are
    shorter (DynaRL's observation 3). Where they are not (over `min_samples` first turns
    and as many later ones, a later turn is on average longer than a first one), the
    key falls back to FIFO (components/rollout/queue_keys.py), so on such a workload the
    priority costs at most what it does before it has seen that many turns."""
    min_samples: int = 16
    first_turns: int = 0
    first_tokens: int = 0
    later_turns: int = 0
    later_tokens: int = 0

    def observe(self, tool_count: int, output_tokens: int) -> None:
        if tool_count <= 0:
            self.first_turns += 1
            self.first_tokens += output_tokens
        else:
            self.later_turns += 1
            self.later_tokens += output_tokens

    def later_turns_shorter(self) -> bool | None:
        """None until both kinds have `min_samples` turns."""
        if self.first_turns < self.min_samples or self.later_turns < self.min_samples:
            return None
        return self.later_tokens / self.later_turns <= self.first_tokens / self.first_turns
