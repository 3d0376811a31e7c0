"""The LLM judge's pure parts: its prompt from a template, its score from its text,
and the reward from the score.

    render(template, prompt=..., response=..., answer=...)   the judge's prompt text
    parse_score(text, kind, pattern, low, high)             a score in [0, 1], or None
    combine(reward, score, how, weight)                     the sample's new reward

A template names the sample's parts as {prompt}, {response} and {answer}; any other
brace is text (a JSON example in the instructions stays as written), and a part's own
text is never read as a placeholder (a response that writes "{answer}" does not get
the reference answer pasted into the judge's prompt). The judge's score is normalised
to [0, 1] (a number in [low, high], or yes / no), so it can stand beside a verifier's
reward; what cannot be read as one is None (the stage counts it and scores the default).
"""
from __future__ import annotations

import re
from typing import Literal

PLACEHOLDERS = ("prompt", "response", "answer")
"""The sample's parts a template may name."""
_SLOT = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
_NAMED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
"""Anything that looks like a placeholder: {word}."""
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)

ParserKind = Literal["number", "yes_no"]
Combine = Literal["replace", "weight"]


def template_problem(template: str) -> str | None:
    """Why `template` cannot be a judge's prompt, or None: it must show the judge the
    {response}, and name no placeholder but {prompt}, {response} and {answer} (a typo
    such as {respones} would otherwise go to the judge as text)."""
    unknown = sorted({m.group(1) for m in _NAMED.finditer(template)} - set(PLACEHOLDERS))
    if unknown:
        return (f"unknown placeholder {{{unknown[0]}}}; a template names "
                + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
    if "{response}" not in template:
        return "must contain {response} (the judge has to see the response it scores)"
    return None


def render(template: str, *, prompt: str, response: str, answer: str) -> str:
    """The template with each placeholder replaced by the sample's part, in one pass."""
    parts = {"prompt": prompt, "response": response, "answer": answer}
    return _SLOT.sub(lambda m: parts[m.group(1)], template)


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` cannot find a number score, or None."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"not a regular expression: {exc}"
    if compiled.groups > 1:
        return f"has {compiled.groups} groups; give none (the whole match is the score) or one (it is)"
    return None


def parse_score(text: str, kind: ParserKind, pattern: str = r"-?\d+(?:\.\d+)?", low: float = 0.0,
                high: float = 10.0) -> float | None:
    """The judge's score in [0, 1], or None where `text` holds none.
    number: the first match of `pattern` (its group, if it has one) read as a number
    in [low, high], mapped linearly onto [0, 1]; a number outside the range is no
    score. yes_no: the first word yes (1) or no (0), in any case."""
    if kind == "yes_no":
        m = _YES_NO.search(text)
        return None if m is None else (1.0 if m.group(1).lower() == "yes" else 0.0)
    if kind != "number":
        raise ValueError(f"unknown parser kind {kind!r}; choose 'number' or 'yes_no'")
    m = re.search(pattern, text)
    if m is None:
        return None
    try:
        value = float(m.group(1) if m.re.groups else m.group(0))
    except (TypeError, ValueError):
        return None
    if not low <= value <= high:
        return None
    return (value - low) / (high - low)


def combine(reward: float, score: float, how: Combine, weight: float = 0.5) -> float:
    """The sample's reward once judged: the judge's score alone (replace), or
    (1 - weight) x the reward stage's reward + weight x the score (weight)."""
    if how == "replace":
        return score
    if how == "weight":
        return (1.0 - weight) * reward + weight * score
    raise ValueError(f"unknown combine {how!r}; choose 'replace' or 'weight'")
