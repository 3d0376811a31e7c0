"""The tiny tool-call syntax of the built-in agentic task (char-tokenizer friendly).

A model turn that ends with "]" is a tool call, the text from its last "[":

    [calc 347*29]      the calculator (components/tools/calculator.py)
    [py print(2**70)]  the Python sandbox (components/tools/python_sandbox.py)

The workflow runs the tool and appends the observation "=<output>\n" (or
"!<error>\n"); those tokens are the environment's, masked out of the loss. A
turn that ends with EOS is the answer. Parsing is a pure function: every reply
is a Call, an Answer, or Malformed with the reason (counted by the workflow).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

OPEN, CLOSE = "[", "]"
TOOLS = ("calc", "py")
MAX_ARG_CHARS = 200
_CALL = re.compile(r"\[([a-z]+) (.+)\]\Z", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Call:
    tool: str
    argument: str


@dataclass(frozen=True, slots=True)
class Answer:
    text: str


@dataclass(frozen=True, slots=True)
class Malformed:
    reason: str


def parse_turn(text: str, stopped_on_close: bool) -> Call | Answer | Malformed:
    """A turn's text; `stopped_on_close`: generation stopped on the "]" stop token
    (anything else, EOS or the length cap, makes the turn the answer)."""
    if not stopped_on_close:
        return Answer(text.strip())
    start = text.rfind(OPEN)
    if start < 0:
        return Malformed("no '[' before ']'")
    match = _CALL.match(text[start:])
    if match is None:
        return Malformed("expected '[tool argument]'")
    tool, argument = match.group(1), match.group(2).strip()
    if tool not in TOOLS:
        return Malformed(f"unknown tool {tool!r}")
    if not argument:
        return Malformed("empty argument")
    if len(argument) > MAX_ARG_CHARS:
        return Malformed(f"argument longer than {MAX_ARG_CHARS} characters")
    return Call(tool, argument)


def call_text(tool: str, argument: str) -> str:
    return f"{OPEN}{tool} {argument}{CLOSE}"


def observation_text(ok: bool, output: str, error: str | None, max_chars: int) -> str:
    """What the model reads after a call: short, single-line, printable ASCII
    (the char tokenizer knows no other characters)."""
    body = output.strip() if ok else (error or "error")
    body = "".join(ch if " " <= ch <= "~" else "?" for ch in body.replace("\n", " "))[:max_chars]
    return ("=" if ok else "!") + body + "\n"


def malformed_observation(reason: str, max_chars: int) -> str:
    return observation_text(False, "", f"bad call: {reason}", max_chars)
