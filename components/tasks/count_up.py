"""The built-in task: count up through an alphabet from a start to an end symbol.

    prompt  "d>k:"        answer  "defghijk"

Why this task: a 0.5M-parameter model learns it on two CPU cores within minutes
(a short supervised warm start teaches the format; RL then sharpens the stopping
decision, which is where the samples of a group disagree), the reward is
verifiable, and the *correct* response length is set by the prompt. Lengths are
drawn log-normal (median `median_len`, shape `sigma`), clipped to the alphabet:
most answers are a few symbols, a few run to the end of the alphabet. That
heavy tail is the rollout long tail that pipelining and dynamic scheduling
exploit: the last groups of a step decode alone at a small batch size.
"""
from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass

from dynarl.components.tasks.problem import Problem, stable_seed


@dataclass(kw_only=True, slots=True)
class CountUpConfig:
    alphabet: str = string.ascii_lowercase
    """The ordered symbols to count through; the longest answer is all of them."""
    median_len: float = 3.0
    """Median answer length (symbols)."""
    sigma: float = 0.9
    """Log-normal shape of the answer length: larger means a heavier tail."""

    def __post_init__(self) -> None:
        if len(self.alphabet) < 2 or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError("alphabet needs at least 2 symbols, none repeated")
        if set(self.alphabet) & set(">:"):
            raise ValueError("alphabet must not contain the prompt's separators '>' or ':'")
        if not 1 <= self.median_len <= len(self.alphabet):
            raise ValueError(f"median_len must be in [1, {len(self.alphabet)}], got {self.median_len}")
        if not self.sigma > 0:
            raise ValueError(f"sigma must be > 0, got {self.sigma}")


class CountUpTask:
    """Problem i of the stream is a pure function of (seed, i)."""

    def __init__(self, config: CountUpConfig, seed: int) -> None:
        self.config = config
        self.seed = seed

    def problem(self, index: int, stream: str = "cu") -> Problem:
        rng = random.Random(stable_seed(self.seed, stream, index))
        alphabet = self.config.alphabet
        length = self.answer_length(rng)
        start = rng.randrange(len(alphabet) - length + 1)
        answer = alphabet[start:start + length]
        return Problem(f"{stream}-{index}", f"{answer[0]}>{answer[-1]}:", answer)

    def answer_length(self, rng: random.Random) -> int:
        c = self.config
        drawn = round(rng.lognormvariate(math.log(c.median_len), c.sigma))
        return min(max(drawn, 1), len(c.alphabet))


def count_up_score(response: str, answer: str) -> float:
    """1 for the exact answer; otherwise half the fraction of positions that match
    (over the longer of the two), so stopping one symbol early or late still
    beats a wrong chain and a group's samples differ in reward."""
    if response == answer:
        return 1.0
    matches = sum(a == b for a, b in zip(response, answer))
    return 0.5 * matches / max(len(response), len(answer), 1)
