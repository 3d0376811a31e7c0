"""A TurnOutput -> OpenAI's response JSON: chat.completion, text_completion, their stream
chunks (server-sent events), the model list and the error body. Pure: the id and the
creation time come in, so a test compares whole objects.

The turn arrives whole from the backend, so a stream is a few chunks: the role, the
content, the tool calls, the finish reason, then (stream_options.include_usage) a usage
chunk with no choices, as OpenAI sends them. Logprobs are the sampled tokens' own; the
engine keeps no alternatives, so each token's top_logprobs is empty (chat) and a
completion's top_logprobs is null. JSON has no infinity: a logprob of -inf (a token the
engine's mask ruled out) is written as -9999.0, as vLLM does."""
from __future__ import annotations

import json
import math
from typing import Any

from dynarl.components.agents.messages import ToolCall, TurnOutput


def error_body(message: str, type: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, which the openai client reads into APIStatusError."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def model_list(model: str) -> dict[str, Any]:
    return {"object": "list",
            "data": [{"id": model, "object": "model", "created": 0, "owned_by": "dynarl"}]}


def usage(out: TurnOutput) -> dict[str, int]:
    completion = len(out.token_ids)
    return {"prompt_tokens": out.prompt_tokens, "completion_tokens": completion,
            "total_tokens": out.prompt_tokens + completion}


def chat_completion(out: TurnOutput, *, model: str, id: str, created: int,
                    logprobs: bool) -> dict[str, Any]:
    """A whole chat.completion: one choice. Content is null when the turn is only tool
    calls (as OpenAI answers); tool_calls is left out when there are none."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if out.text == "" and out.tool_calls else out.text}
    if out.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in out.tool_calls]
    return {"id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": out.finish_reason,
                         "logprobs": _chat_logprobs(out) if logprobs else None}],
            "usage": usage(out)}


def chat_chunks(out: TurnOutput, *, model: str, id: str, created: int, logprobs: bool,
                include_usage: bool) -> list[dict[str, Any]]:
    """The chat.completion.chunk objects of a streamed turn. The logprobs ride on the
    first chunk after the role's; a client that concatenates them gets them all."""
    deltas: list[dict[str, Any]] = []
    if out.text:
        deltas.append({"content": out.text})
    if out.tool_calls:
        deltas.append({"tool_calls": [{"index": i, **_tool_call(c)}
                                      for i, c in enumerate(out.tool_calls)]})
    deltas.append({})  # the finish chunk
    choices = [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}
               for d in [{"role": "assistant", "content": ""}] + deltas]
    choices[-1]["finish_reason"] = out.finish_reason
    if logprobs:
        choices[1]["logprobs"] = _chat_logprobs(out)
    head = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model}
    return _with_usage(head, choices, out, include_usage)


def text_completion(out: TurnOutput, *, model: str, id: str, created: int,
                    logprobs: bool) -> dict[str, Any]:
    """A whole text_completion: one choice."""
    return {"id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"text": out.text, "index": 0, "finish_reason": out.finish_reason,
                         "logprobs": _completion_logprobs(out) if logprobs else None}],
            "usage": usage(out)}


def completion_chunks(out: TurnOutput, *, model: str, id: str, created: int,
                      logprobs: bool, include_usage: bool) -> list[dict[str, Any]]:
    """The text_completion chunks of a streamed turn: the text, then the finish reason."""
    choices: list[dict[str, Any]] = [
        {"text": out.text, "index": 0, "finish_reason": None,
         "logprobs": _completion_logprobs(out) if logprobs else None},
        {"text": "", "index": 0, "finish_reason": out.finish_reason, "logprobs": None}]
    head = {"id": id, "object": "text_completion", "created": created, "model": model}
    return _with_usage(head, choices, out, include_usage)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; NaN or infinity raise (JSON has neither)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode()


def sse(chunks: list[dict[str, Any]]) -> list[bytes]:
    """Server-sent events: one `data:` line per chunk, then OpenAI's `data: [DONE]`."""
    return [b"data: " + dumps(c) + b"\n\n" for c in chunks] + [b"data: [DONE]\n\n"]


def _with_usage(head: dict[str, Any], choices: list[dict[str, Any]], out: TurnOutput,
                include_usage: bool) -> list[dict[str, Any]]:
    """One chunk per choice; with include_usage every chunk carries "usage": null and a
    last chunk with no choices carries the usage (OpenAI's stream_options)."""
    extra = {"usage": None} if include_usage else {}
    chunks = [{**head, "choices": [c], **extra} for c in choices]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": usage(out)})
    return chunks


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _chat_logprobs(out: TurnOutput) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": _finite(lp), "bytes": list(t.encode("utf-8")),
                         "top_logprobs": []} for t, lp in zip(out.tokens, out.logprobs)]}


def _completion_logprobs(out: TurnOutput) -> dict[str, Any]:
    tokens = list(out.tokens[:len(out.logprobs)])
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [_finite(lp) for lp in out.logprobs[:len(tokens)]],
            "top_logprobs": None, "text_offset": offsets}


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else -9999.0
