"""What a reward function is given for one sample, what becomes of its call, and a
reward stage's tally of them (pure: no I/O).

A call's return is a number, or a mapping with a "reward" number whose other numbers
are named scores (`reward_of`). A call that raised, timed out, or returned anything
else costs its sample alone: reward.on_error, and a count in the step's metrics.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

MAX_MESSAGE = 300
"""Characters of an error message kept (metrics.jsonl and the log line)."""


@dataclass(frozen=True, slots=True)
class RewardInput:
    """One sample as the function sees it."""
    prompt: str
    """The prompt as the model saw it: its tokens decoded, special tokens left out."""
    response: str
    """The sample's response text (its end-of-sequence token left out)."""
    answer: str
    """The task's reference answer."""
    problem_id: str
    """The problem's stable id: "cu-17" (built-in task), "e0:r42" (dataset epoch 0, row 42)."""
    sample_id: str
    """The sample's: its problem id and its place in the group, "cu-17/3"."""
    metadata: dict[str, Any]
    """A dataset row's fields other than its prompt and answer ({} for a built-in task)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One sample's call: its reward (on_error when it failed), named scores, and why it failed."""
    reward: float
    scores: dict[str, float] = field(default_factory=dict)
    failure: Literal["", "error", "timeout"] = ""
    message: str = ""


def reward_of(value: Any) -> tuple[float, dict[str, float]]:
    """(reward, named scores) of a call's return; ValueError saying what is wrong with it.
    A named score that is no finite number is left out (the reward decides the sample)."""
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise ValueError(f"returned a mapping without 'reward' (keys: {', '.join(map(str, list(value)[:8]))})")
        reward = _number(value["reward"], "'reward'")
        scores = {str(k): float(v) for k, v in value.items()
                  if k != "reward" and _is_number(v) and math.isfinite(float(v))}
        return reward, scores
    return _number(value, "the value"), {}


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _number(value: Any, what: str) -> float:
    if not _is_number(value):
        raise ValueError(f"returned {_kind(value)} as {what}, not a number or a mapping with a 'reward' number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"returned {number} as {what}, not a finite number")
    return number


def _kind(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def judged(value: Any, on_error: float) -> Outcome:
    """A returned value's outcome: its reward and scores, or an error costing on_error."""
    try:
        reward, scores = reward_of(value)
    except ValueError as exc:
        return failed("error", str(exc), on_error)
    return Outcome(reward, scores)


def failed(failure: Literal["error", "timeout"], message: str, on_error: float) -> Outcome:
    return Outcome(on_error, {}, failure, short(message))


def timeout_message(timeout_s: float) -> str:
    return f"no result within {timeout_s:g} s (reward.timeout_s)"


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


@dataclass(slots=True)
class Tally:
    """A reward stage's outcomes over one step: failures counted, the first one's
    message kept, the named scores summed (their step mean: sum / count)."""
    errors: int = 0
    timeouts: int = 0
    first_error: str = ""
    """"sample ID: message" of the first failed call."""
    scores: dict[str, list[float]] = field(default_factory=dict)
    """name -> [sum, count] over the samples that returned it."""

    def add(self, sample_id: str, outcome: Outcome) -> None:
        if outcome.failure == "timeout":
            self.timeouts += 1
        elif outcome.failure == "error":
            self.errors += 1
        if outcome.failure and not self.first_error:
            self.first_error = f"sample {sample_id}: {outcome.message}"
        for name, value in outcome.scores.items():
            total = self.scores.setdefault(name, [0.0, 0])
            total[0] += value
            total[1] += 1

    @classmethod
    def of_ranks(cls, stats: Sequence[Any]) -> "Tally":
        """The step's tally over every reward rank's RewardStats (first error: the first rank's that had one)."""
        return cls(errors=sum(s.errors for s in stats), timeouts=sum(s.timeouts for s in stats),
                   first_error=next((s.first_error for s in stats if s.first_error), ""))

    def summary(self, samples: int) -> str | None:
        """The one line a step logs about its failed calls (the workflow, over every
        reward rank: Tally.of_ranks), or None when none failed."""
        if not (self.errors or self.timeouts):
            return None
        return (f"reward.function failed on {self.errors + self.timeouts} of {samples} samples this step "
                f"({self.errors} errors, {self.timeouts} timeouts; their reward: reward.on_error); "
                f"the first: {self.first_error}")
