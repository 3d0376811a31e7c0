"""Verifiers: response text + reference answer -> reward in [0, 1].

- count_up: the built-in task's score (exact 1, else partial credit).
- exact: 1 when the stripped texts are equal.
- math: math-verify (HuggingFace's answer checker: LaTeX / expressions / numbers,
  equivalence via sympy). If the package is missing, a clearly reported fallback
  compares the last number (or the stripped text) of both sides.
- none: no verifier, every reward 0: a simulated workload (`dynarl sim`), whose
  responses are lengths without text.
"""
from __future__ import annotations

import functools
import logging
import re
from typing import Callable

from dynarl.components.tasks.count_up import count_up_score

log = logging.getLogger(__name__)
Verifier = Callable[[str, str], float]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def exact_match(response: str, answer: str) -> float:
    return 1.0 if response.strip() == answer.strip() else 0.0


class MathVerifier:
    """math-verify when installed; otherwise the last-number fallback. `backend` says which."""

    def __init__(self) -> None:
        try:
            from math_verify import parse, verify
        except ImportError:
            log.warning("math-verify is not installed: math answers are checked by the last-number "
                        "fallback (pip install math-verify for real checking)")
            self.backend = "fallback"
            self._parse = self._verify = None
        else:
            self.backend = "math-verify"
            self._parse, self._verify = parse, verify
            self._gold = functools.lru_cache(maxsize=4096)(lambda answer: parse(_as_math(answer)))
            """A reference parsed once: a group's samples share it (~0.5 ms a parse)."""

    def __call__(self, response: str, answer: str) -> float:
        if self._verify is None:
            return _last_number_match(response, answer)
        gold = self._gold(answer)
        if not gold:  # the reference itself does not parse as math
            return exact_match(response, answer)
        try:
            return 1.0 if self._verify(gold, self._parse(response)) else 0.0
        except Exception:  # a pathological response must cost its sample, not the run
            return 0.0


def _as_math(answer: str) -> str:
    """A bare reference ("42", "\\frac{1}{2}") parses best wrapped in $...$."""
    return answer if "$" in answer or "\\boxed" in answer else f"${answer}$"


def _last_number_match(response: str, answer: str) -> float:
    mine, theirs = _NUMBER.findall(response), _NUMBER.findall(answer)
    if theirs:
        return 1.0 if mine and mine[-1] == theirs[-1] else 0.0
    return exact_match(response, answer)


def make_verifier(kind: str) -> tuple[Verifier | None, str]:
    """(verifier, backend name for the run's report); None for 'none'."""
    if kind == "none":
        return None, "none"
    if kind == "count_up":
        return count_up_score, "count_up"
    if kind == "exact":
        return exact_match, "exact"
    if kind == "math":
        verifier = MathVerifier()
        return verifier, verifier.backend
    raise ValueError(f"unknown verifier {kind!r}; choose from 'count_up', 'exact', 'math', 'none'")
