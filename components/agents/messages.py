"""The records of the agent endpoint: a chat request as validated, the messages and
tool calls in it, and what one model turn gives back. The HTTP layer (server.py)
makes these from JSON and writes them back as OpenAI's JSON; the sessions
(sessions.py) and the chat format (chat_format.py) see only these."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call: OpenAI carries its arguments as JSON text."""
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: Role
    content: str = ""
    """The text ("" for none; a list of text parts is joined)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant message's calls."""
    tool_call_id: str = ""
    """A tool message: the call it answers."""
    name: str = ""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A function the request offers the model."""
    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    """Its JSON schema."""


@dataclass(frozen=True, slots=True)
class Sampling:
    """What a request asks of the turn's sampling."""
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    """A stream ends with a usage chunk (stream_options.include_usage)."""


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: str = "auto"
    """'auto', 'none', 'required' or a function's name."""
    sampling: Sampling = Sampling()
    model: str = ""


@dataclass(frozen=True, slots=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    """Text, or token ids."""
    sampling: Sampling = Sampling()
    model: str = ""


@dataclass(frozen=True, slots=True)
class TurnOutput:
    """One model turn as the endpoint answers it."""
    text: str
    """The content: the model's text with its tool calls taken out."""
    tool_calls: tuple[ToolCall, ...]
    finish_reason: Literal["stop", "length", "tool_calls"]
    token_ids: tuple[int, ...]
    """The ids the engine produced (what is trained)."""
    logprobs: tuple[float, ...]
    tokens: tuple[str, ...]
    """Each id's text (for a response's logprobs)."""
    prompt_tokens: int


class BadRequest(ValueError):
    """A request the endpoint answers with 400; `param` names the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownSession(LookupError):
    """No such session (404)."""


class SessionBusy(RuntimeError):
    """The session has a request under way (409): an episode is one conversation."""
