"""OpenAI request JSON -> the endpoint's records (messages.py). Pure: each function takes
the decoded body and either returns a record or raises BadRequest naming the field by
its path ("messages[2].role"), which the server answers with 400 and that `param`.

What the official `openai` client sends is accepted: null for an optional field (an
agent that appends `message.model_dump()` sends "tool_calls": null, "refusal": null),
text-part lists, "developer" as "system", max_completion_tokens for max_tokens. Fields
that do not change the turn (seed, user, parallel_tool_calls, ...) are ignored; those
whose meaning the endpoint cannot honour (n > 1, echo, best_of, suffix, a logit_bias, a
presence/frequency penalty, a response_format other than text) are refused rather than
silently dropped (a penalty or bias would change the sampling the trainer's log-probs
assume). top_p and temperature are read; the sessions refuse values other than the run's."""
from __future__ import annotations

import math
from typing import Any

from dynarl.components.agents.messages import (
    BadRequest, ChatMessage, ChatRequest, CompletionRequest, Sampling, ToolCall, ToolSpec)

_ROLES = {"system": "system", "developer": "system", "user": "user",
          "assistant": "assistant", "tool": "tool"}
_TOOL_CHOICES = ("auto", "none", "required")


def parse_chat_request(obj: Any) -> ChatRequest:
    """A /v1/chat/completions body as a ChatRequest."""
    body = _object(obj, None)
    messages = _list(body.get("messages"), "messages", required=True)
    if not messages:
        raise BadRequest("messages must not be empty", "messages")
    tools = tuple(_tool(t, f"tools[{i}]")
                  for i, t in enumerate(_list(body.get("tools"), "tools")))
    return ChatRequest(
        messages=tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages)),
        tools=tools,
        tool_choice=_tool_choice(body.get("tool_choice"), tools),
        sampling=_sampling(body, chat=True),
        model=_str(body.get("model"), "model"))


def parse_completion_request(obj: Any) -> CompletionRequest:
    """A /v1/completions body as a CompletionRequest: one prompt, text or token ids."""
    body = _object(obj, None)
    if body.get("echo") not in (None, False):
        raise BadRequest("echo is not supported", "echo")
    if body.get("best_of") not in (None, 1):
        raise BadRequest("best_of must be 1", "best_of")
    if body.get("suffix") not in (None, ""):
        raise BadRequest("suffix is not supported", "suffix")
    return CompletionRequest(prompt=_prompt(body.get("prompt")),
                             sampling=_sampling(body, chat=False),
                             model=_str(body.get("model"), "model"))


def _prompt(value: Any) -> str | tuple[int, ...]:
    if isinstance(value, str):
        if not value:
            raise BadRequest("prompt must not be empty", "prompt")
        return value
    if not isinstance(value, list):
        raise BadRequest("prompt must be a string or a list of token ids", "prompt")
    if not value:
        raise BadRequest("prompt must not be empty", "prompt")
    if isinstance(value[0], (str, list)):
        raise BadRequest("one prompt per request (a batch of prompts is not supported)",
                         "prompt")
    return tuple(_int(v, f"prompt[{i}]", low=0) for i, v in enumerate(value))


def _message(obj: Any, path: str) -> ChatMessage:
    m = _object(obj, path)
    role_name = m.get("role")
    if role_name not in _ROLES:
        raise BadRequest(f"role must be one of {sorted(_ROLES)}, not {role_name!r}",
                         f"{path}.role")
    role = _ROLES[role_name]
    content = _content(m.get("content"), f"{path}.content", optional=role == "assistant")
    calls = _list(m.get("tool_calls"), f"{path}.tool_calls")
    if calls and role != "assistant":
        raise BadRequest("only an assistant message has tool_calls", f"{path}.tool_calls")
    tool_call_id = _str(m.get("tool_call_id"), f"{path}.tool_call_id")
    if role == "tool" and not tool_call_id:
        raise BadRequest("a tool message needs tool_call_id", f"{path}.tool_call_id")
    return ChatMessage(
        role=role, content=content,  # type: ignore[arg-type]
        tool_calls=tuple(_tool_call(c, f"{path}.tool_calls[{k}]") for k, c in enumerate(calls)),
        tool_call_id=tool_call_id, name=_str(m.get("name"), f"{path}.name"))


def _content(value: Any, path: str, *, optional: bool) -> str:
    """A message's text: a string, a list of {"type": "text", "text"} parts (joined by
    newlines, as vLLM does) or, for an assistant, null."""
    if isinstance(value, str):
        return value
    if value is None:
        if optional:
            return ""
        raise BadRequest("content is required", path)
    if not isinstance(value, list):
        raise BadRequest("content must be a string or a list of text parts", path)
    texts = []
    for j, part in enumerate(value):
        p = _object(part, f"{path}[{j}]")
        if p.get("type") != "text":
            raise BadRequest(f"only text parts are supported, not {p.get('type')!r}",
                             f"{path}[{j}].type")
        texts.append(_str(p.get("text"), f"{path}[{j}].text", required=True))
    return "\n".join(texts)


def _tool_call(obj: Any, path: str) -> ToolCall:
    c = _object(obj, path)
    if c.get("type", "function") != "function":
        raise BadRequest("a tool call's type must be 'function'", f"{path}.type")
    fn = _object(c.get("function"), f"{path}.function")
    return ToolCall(id=_str(c.get("id"), f"{path}.id", required=True),
                    name=_str(fn.get("name"), f"{path}.function.name", required=True),
                    arguments=_str(fn.get("arguments"), f"{path}.function.arguments",
                                   required=True))


def _tool(obj: Any, path: str) -> ToolSpec:
    t = _object(obj, path)
    if t.get("type") != "function":
        raise BadRequest("a tool's type must be 'function'", f"{path}.type")
    fn = _object(t.get("function"), f"{path}.function")
    parameters = fn.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise BadRequest("parameters must be a JSON schema object", f"{path}.function.parameters")
    return ToolSpec(name=_str(fn.get("name"), f"{path}.function.name", required=True),
                    description=_str(fn.get("description"), f"{path}.function.description"),
                    parameters=parameters or {})


def _tool_choice(value: Any, tools: tuple[ToolSpec, ...]) -> str:
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in _TOOL_CHOICES:
            raise BadRequest(f"tool_choice must be one of {list(_TOOL_CHOICES)} or a "
                             f"function, not {value!r}", "tool_choice")
        if value == "required" and not tools:
            raise BadRequest("tool_choice 'required' needs tools", "tool_choice")
        return value
    choice = _object(value, "tool_choice")
    if choice.get("type") != "function":
        raise BadRequest("tool_choice's type must be 'function'", "tool_choice.type")
    name = _str(_object(choice.get("function"), "tool_choice.function").get("name"),
                "tool_choice.function.name", required=True)
    if name not in {t.name for t in tools}:
        raise BadRequest(f"tool_choice names {name!r}, which is not among the tools",
                         "tool_choice.function.name")
    return name


def _sampling(body: dict, *, chat: bool) -> Sampling:
    max_tokens = _opt_int(body.get("max_completion_tokens"), "max_completion_tokens", low=1)
    if max_tokens is None:
        max_tokens = _opt_int(body.get("max_tokens"), "max_tokens", low=1)
    temperature = body.get("temperature")
    if temperature is not None:
        if not _is_number(temperature) or not 0 <= temperature <= 2:
            raise BadRequest("temperature must be a number from 0 to 2", "temperature")
        temperature = float(temperature)
    if (_opt_int(body.get("n"), "n", low=1) or 1) != 1:
        raise BadRequest("n must be 1 (a session is one conversation)", "n")
    top_p = body.get("top_p")
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise BadRequest("top_p must be a number in (0, 1]", "top_p")
        top_p = float(top_p)
    for name, neutral in (("presence_penalty", 0), ("frequency_penalty", 0), ("repetition_penalty", 1)):
        if body.get(name) is not None and body.get(name) != neutral:
            raise BadRequest(f"{name}: the run samples the policy as it is (a penalty would change what "
                             f"the trainer's log-probs assume)", name)
    if body.get("logit_bias") not in (None, {}):
        raise BadRequest("logit_bias: the run samples the policy as it is", "logit_bias")
    response_format = body.get("response_format")
    if response_format is not None and _object(response_format, "response_format").get("type") != "text":
        raise BadRequest("response_format: only text (no constrained decoding)", "response_format")
    if chat:
        logprobs = _opt_bool(body.get("logprobs"), "logprobs")
        top = _opt_int(body.get("top_logprobs"), "top_logprobs", low=0, high=20) or 0
        if top and not logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    else:  # completions: logprobs is how many alternatives (0 to 5) each token reports
        count = _opt_int(body.get("logprobs"), "logprobs", low=0, high=5)
        logprobs, top = count is not None, count or 0
    stream = _opt_bool(body.get("stream"), "stream")
    usage = False
    options = body.get("stream_options")
    if options is not None:
        usage = _opt_bool(_object(options, "stream_options").get("include_usage"),
                          "stream_options.include_usage")
    return Sampling(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                    stop=_stop(body.get("stop")), n=1, logprobs=logprobs,
                    top_logprobs=top, stream=stream, include_usage=stream and usage)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    stops = _list(value, "stop")
    return tuple(_str(s, f"stop[{i}]", required=True) for i, s in enumerate(stops))


# ---- typed field readers: each raises BadRequest with the field's path


def _object(value: Any, path: str | None) -> dict:
    if not isinstance(value, dict):
        raise BadRequest(f"{path or 'the body'} must be a JSON object", path)
    return value


def _list(value: Any, path: str, *, required: bool = False) -> list:
    if value is None and not required:
        return []
    if not isinstance(value, list):
        raise BadRequest(f"{path} must be a list", path)
    return value


def _str(value: Any, path: str, *, required: bool = False) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise BadRequest(f"{path} must be a{' non-empty' if required else ''} string", path)
    return value


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _int(value: Any, path: str, *, low: int, high: int | None = None) -> int:
    if (not isinstance(value, int) or isinstance(value, bool) or value < low
            or (high is not None and value > high)):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise BadRequest(f"{path} must be an integer {bound}", path)
    return value


def _opt_int(value: Any, path: str, *, low: int, high: int | None = None) -> int | None:
    return None if value is None else _int(value, path, low=low, high=high)


def _opt_bool(value: Any, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"{path} must be true or false", path)
    return value
