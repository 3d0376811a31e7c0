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

from dataclasses import dataclass, field

MAX_TURN_INDEX = 16
"""Tool counts from here on are one class for the learned per-turn lengths."""


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
    priority costs at most what it does before it has seen that many turns. Learned per
    turn index too (`by_turn`, `turn_keeps_bonus`): where later turns are shorter on
    average but the turns of some index are longer than first turns, those turns are
    keyed FIFO and the others keep the priority."""
    min_samples: int = 16
    first_turns: int = 0
    first_tokens: int = 0
    later_turns: int = 0
    later_tokens: int = 0
    by_turn: dict[int, list[int]] = field(default_factory=dict)
    """tool_count (capped at MAX_TURN_INDEX) -> [turns finished, their output tokens]."""

    def observe(self, tool_count: int, output_tokens: int) -> None:
        if tool_count <= 0:
            self.first_turns += 1
            self.first_tokens += output_tokens
        else:
            self.later_turns += 1
            self.later_tokens += output_tokens
        seen = self.by_turn.setdefault(min(max(tool_count, 0), MAX_TURN_INDEX), [0, 0])
        seen[0] += 1
        seen[1] += output_tokens

    def mean(self, tool_count: int) -> float | None:
        """Mean output tokens of the turns finished with this tool count (capped at
        MAX_TURN_INDEX); None below `min_samples` of them."""
        n, tokens = self.by_turn.get(min(max(tool_count, 0), MAX_TURN_INDEX), (0, 0))
        return tokens / n if n >= self.min_samples else None

    def turn_keeps_bonus(self, tool_count: int) -> bool:
        """Whether a turn with this tool count keeps the priority's bonus (else its key is
        its arrival time, FIFO). Per turn index where both it and first turns have
        `min_samples` finished: the bonus stays while that index's mean output is not
        longer than a first turn's (a bimodal workload can have later turns shorter on
        average and some turn index longer: that index alone loses it). Below that, the
        pooled check (later_turns_shorter): off once later turns are longer on average."""
        if self.later_turns_shorter() is False:
            return False
        if tool_count <= 0:
            return True
        first, this = self.mean(0), self.mean(tool_count)
        return first is None or this is None or this <= first

    def later_turns_shorter(self) -> bool | None:
        """None until both kinds have `min_samples` turns."""
        if self.first_turns < self.min_samples or self.later_turns < self.min_samples:
            return None
        return self.later_tokens / self.later_turns <= self.first_tokens / self.first_turns
