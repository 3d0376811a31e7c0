"""Tool calls in a model's text: how a reply's calls are read out of it (parse_reply)
and how a call is written back into a turn (call_text), for the two formats open
models are trained on:

- hermes (Hermes, Qwen2.5, Qwen3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks, with free text around them;
- llama3 (Llama 3.1/3.2 JSON tool calling): the whole reply, after an optional
  `<|python_tag|>`, is `{"name": ..., "parameters": {...}}`, or several joined by ";".

A reply that looks like a call but does not parse is `malformed`: its text stays the
content, it has no calls, and the reason says why (the agent sees plain text; the
trainer can count and penalise it)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from dynarl.components.agents.messages import ToolCall

Parser = Literal["hermes", "llama3"]
PARSERS: tuple[str, ...] = get_args(Parser)

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True, slots=True)
class ParsedReply:
    content: str
    """The text outside the calls, stripped (the whole text when malformed)."""
    calls: tuple[ToolCall, ...]
    malformed: str | None
    """Why call-looking text did not parse; None when it did or there was none."""


class _Malformed(ValueError):
    pass


def parse_reply(text: str, parser: Parser, id_prefix: str = "call") -> ParsedReply:
    """The content and tool calls of a model's reply; call ids are f"{id_prefix}_{k}"."""
    try:
        if parser == "hermes":
            content, found = _hermes(text)
        elif parser == "llama3":
            content, found = _llama3(text)
        else:
            raise ValueError(f"parser must be one of {PARSERS}, not {parser!r}")
    except _Malformed as e:
        return ParsedReply(text, (), str(e))
    calls = tuple(ToolCall(f"{id_prefix}_{k}", name, json.dumps(args, ensure_ascii=False))
                  for k, (name, args) in enumerate(found))
    return ParsedReply(content, calls, None)


def _hermes(text: str) -> tuple[str, list[tuple[str, dict]]]:
    outside, found, pos = [], [], 0
    while (start := text.find(HERMES_OPEN, pos)) >= 0:
        end = text.find(HERMES_CLOSE, start)
        if end < 0:
            raise _Malformed(f"unclosed {HERMES_OPEN}")
        outside.append(text[pos:start])
        found.append(_call(_json_object(text[start + len(HERMES_OPEN):end].strip()), ("arguments",)))
        pos = end + len(HERMES_CLOSE)
    outside.append(text[pos:])
    return "".join(outside).strip(), found


def _llama3(text: str) -> tuple[str, list[tuple[str, dict]]]:
    body = text.strip()
    tagged = body.startswith(PYTHON_TAG)
    if tagged:
        body = body[len(PYTHON_TAG):].strip()
    if not body.startswith("{"):
        if tagged:
            raise _Malformed(f"{PYTHON_TAG} is not followed by a JSON object")
        return text.strip(), []
    decoder, found, pos = json.JSONDecoder(), [], 0
    while True:
        try:
            value, pos = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            raise _Malformed(f"invalid JSON: {e}") from None
        if not isinstance(value, dict):
            raise _Malformed("a call is not a JSON object")
        found.append(_call(value, ("parameters", "arguments")))
        rest = body[pos:].lstrip()
        if not rest:
            return "", found
        if not rest.startswith(";"):
            raise _Malformed("text after a call (calls are separated by ';')")
        body, pos = rest[1:].lstrip(), 0
        if not body:  # a trailing ";"
            return "", found


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Malformed(f"invalid JSON: {e}") from None
    if not isinstance(value, dict):
        raise _Malformed("a call is not a JSON object")
    return value


def _call(value: dict, keys: tuple[str, ...]) -> tuple[str, dict]:
    """(name, arguments) of a call's object; arguments under the first of `keys` present,
    an object or a JSON string holding one."""
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise _Malformed("a call has no 'name' string")
    key = next((k for k in keys if k in value), None)
    if key is None:
        raise _Malformed(f"call {name!r} has no '{keys[0]}'")
    args = value[key]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            raise _Malformed(f"call {name!r}: '{key}' is a string that is not JSON") from None
    if not isinstance(args, dict):
        raise _Malformed(f"call {name!r}: '{key}' is not an object")
    return name, args


def call_arguments(call: ToolCall) -> Any:
    """The call's arguments parsed (OpenAI carries them as JSON text)."""
    try:
        return json.loads(call.arguments)
    except json.JSONDecodeError as e:
        raise ValueError(f"tool call {call.id or call.name!r}: arguments are not JSON ({e})") from None


def call_text(call: ToolCall, parser: Parser) -> str:
    """What the model writes for one call, as compact JSON."""
    key = {"hermes": "arguments", "llama3": "parameters"}.get(parser)
    if key is None:
        raise ValueError(f"parser must be one of {PARSERS}, not {parser!r}")
    body = json.dumps({"name": call.name, key: call_arguments(call)}, separators=(",", ":"), ensure_ascii=False)
    return f"{HERMES_OPEN}{body}{HERMES_CLOSE}" if parser == "hermes" else body


def parser_for(chat_template: str | None, configured: str) -> Parser:
    """The parser to use: the configured one, or with "auto" the template's family
    (llama3 when it speaks of <|python_tag|> or ipython, else hermes)."""
    if configured in PARSERS:
        return configured  # type: ignore[return-value]
    if configured != "auto":
        raise ValueError(f"tool call parser must be one of {('auto', *PARSERS)}, not {configured!r}")
    if chat_template and (PYTHON_TAG in chat_template or "ipython" in chat_template):
        return "llama3"
    return "hermes"
