"""The built-in agentic task: multi-digit arithmetic that needs the calculator.

    prompt  "347*29="     episode  "[calc 347*29]" "=10063\n" "10063" EOS
                                   model turn     observation  model turn (answer)

Why this task: the tiny model cannot multiply 3-digit by 2-digit numbers in its
head, but it can learn to copy the operands into a tool call and copy the tool's
output into its answer (copying is what small transformers learn fast). So the
reward depends on using the tool, and RL improves the copying the supervised
warm start only began. The reward is exact match, with partial credit (half the
fraction of matching digit positions) so a group's samples differ in reward.
"""
from __future__ import annotations

import operator
import random
from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.tasks.count_up import count_up_score
from dynarl.components.tasks.problem import Problem, stable_seed
from dynarl.components.tasks.tool_syntax import call_text, observation_text

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


@dataclass(kw_only=True, slots=True)
class CalcConfig:
    digits: list[int] = field(default_factory=lambda: [3, 2])
    """Digits of the two operands, [left, right]."""
    ops: str = "*+"
    """Operators drawn uniformly (a subset of + - *)."""
    tool: Literal["calc", "py"] = "calc"
    """The tool the warm start demonstrates: "[calc 347*29]", or "[py print(347*29)]",
    which runs in the Python sandbox. Both stay callable in RL either way."""
    warmup_direct_frac: float = 0.5
    """Fraction of warm-start demonstrations that write the answer without calling the
    tool. The warm start then teaches both formats and leaves the choice open; RL
    finds that the tool pays (the tool-call rate and the reward rise together)."""

    def __post_init__(self) -> None:
        self.digits = list(self.digits)
        if len(self.digits) != 2 or not all(isinstance(d, int) and 1 <= d <= 9 for d in self.digits):
            raise ValueError(f"digits must be two integers in [1, 9], got {self.digits}")
        if not self.ops or set(self.ops) - set(OPS) or len(set(self.ops)) != len(self.ops):
            raise ValueError(f"ops must be distinct characters of '+-*', got {self.ops!r}")
        if self.tool not in TOOL_ARGUMENT:
            raise ValueError(f"tool must be one of {sorted(TOOL_ARGUMENT)}, got {self.tool!r}")
        if not 0 <= self.warmup_direct_frac <= 1:
            raise ValueError(f"warmup_direct_frac must be in [0, 1], got {self.warmup_direct_frac}")


class CalcTask:
    """Problem i of a stream is a pure function of (seed, stream, i)."""

    def __init__(self, config: CalcConfig, seed: int) -> None:
        self.config = config
        self.seed = seed

    def problem(self, index: int, stream: str = "calc") -> Problem:
        rng = random.Random(stable_seed(self.seed, stream, index))
        left, right = (rng.randrange(10 ** (d - 1), 10 ** d) for d in self.config.digits)
        op = self.config.ops[rng.randrange(len(self.config.ops))]
        return Problem(f"{stream}-{index}", f"{left}{op}{right}=", str(OPS[op](left, right)))


def expression(problem: Problem) -> str:
    return problem.prompt.rstrip("=")


TOOL_ARGUMENT = {"calc": "{}", "py": "print({})"}
"""How each tool is asked for the value of an expression."""


def demonstration(problem: Problem, max_observation_chars: int = 24, direct: bool = False,
                  tool: str = "calc") -> list[tuple[str, bool]]:
    """A demonstrated episode as (text, is_model_text) segments: the warm start imitates
    the model's segments only, as RL trains them (observations masked). `direct`:
    the answer without the tool (a guess the tiny model cannot back up)."""
    if direct:
        return [(problem.answer, True)]
    return [(call_text(tool, TOOL_ARGUMENT[tool].format(expression(problem))), True),
            (observation_text(True, problem.answer, None, max_observation_chars), False),
            (problem.answer, True)]


def is_direct(problem: Problem, seed: int, direct_frac: float) -> bool:
    """Whether the warm start demonstrates `problem` without the tool (a pure function)."""
    return stable_seed(seed, "direct", problem.id) % 10_000 < direct_frac * 10_000


def calc_score(response: str, answer: str) -> float:
    """count_up_score on the stripped response: 1 for the exact answer, otherwise half
    the fraction of matching positions, so near misses rank above garbage."""
    return count_up_score(response.strip(), answer)
