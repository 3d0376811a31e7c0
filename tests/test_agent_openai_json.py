"""The agent endpoint's pure JSON functions: OpenAI request bodies -> records (each error
naming its field's path) and TurnOutputs -> OpenAI's response and stream-chunk JSON."""
import json

import pytest

from dynarl.components.agents.messages import (
    BadRequest, ChatMessage, ChatRequest, CompletionRequest, Sampling, ToolCall, ToolSpec,
    TurnOutput)
from dynarl.components.agents.openai_requests import (
    parse_chat_request, parse_completion_request)
from dynarl.components.agents.openai_responses import (
    chat_chunks, chat_completion, completion_chunks, error_body, sse, text_completion)

USER = {"role": "user", "content": "hi"}
TOOL = {"type": "function", "function": {"name": "add", "description": "adds",
                                         "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}


def chat(**fields):
    return {"model": "m", "messages": [USER], **fields}


@pytest.mark.parametrize("body, expected", [
    (chat(), ChatRequest(messages=(ChatMessage("user", "hi"),), model="m")),
    ({"messages": [{"role": "developer", "content": "be brief"}, USER]},
     ChatRequest(messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi")))),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                 {"type": "text", "text": "b"}]}]},
     ChatRequest(messages=(ChatMessage("user", "a\nb"),))),
    # an agent appending message.model_dump(): nulls for the fields it does not use
    ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL],
                          "refusal": None, "audio": None, "function_call": None},
                   {"role": "tool", "tool_call_id": "c1", "content": "2", "name": None}]},
     ChatRequest(messages=(ChatMessage("user", "hi"),
                           ChatMessage("assistant", "", (ToolCall("c1", "add", '{"a": 1}'),)),
                           ChatMessage("tool", "2", tool_call_id="c1")))),
    ({"messages": [USER, {"role": "assistant", "content": "ok", "tool_calls": None}]},
     ChatRequest(messages=(ChatMessage("user", "hi"), ChatMessage("assistant", "ok")))),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "add"}}),
     ChatRequest(messages=(ChatMessage("user", "hi"),), model="m", tool_choice="add",
                 tools=(ToolSpec("add", "adds", {"type": "object"}),))),
    (chat(tools=[TOOL], tool_choice="required", max_tokens=5, max_completion_tokens=7,
          temperature=1, stop="\n", logprobs=True, top_logprobs=2, stream=True,
          stream_options={"include_usage": True}, seed=3, top_p=0.9, user="u",
          parallel_tool_calls=False, n=1),
     ChatRequest(messages=(ChatMessage("user", "hi"),), model="m", tool_choice="required",
                 tools=(ToolSpec("add", "adds", {"type": "object"}),),
                 sampling=Sampling(max_tokens=7, temperature=1.0, top_p=0.9, stop=("\n",), logprobs=True,
                                   top_logprobs=2, stream=True, include_usage=True))),
    (chat(max_tokens=5, stop=["a", "b"], stream_options={"include_usage": True}),
     ChatRequest(messages=(ChatMessage("user", "hi"),), model="m",
                 sampling=Sampling(max_tokens=5, stop=("a", "b")))),  # no stream: no usage chunk
])
def test_chat_request_forms(body, expected):
    assert parse_chat_request(body) == expected


@pytest.mark.parametrize("body, param", [
    (chat(top_p=0), "top_p"),
    (chat(presence_penalty=0.5), "presence_penalty"),
    (chat(frequency_penalty=-1), "frequency_penalty"),
    (chat(repetition_penalty=1.1), "repetition_penalty"),
    (chat(logit_bias={"5": 10}), "logit_bias"),
    (chat(response_format={"type": "json_object"}), "response_format"),
    ([USER], None),
    ({}, "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[USER, {"role": "robot", "content": "x"}]), "messages[1].role"),
    (chat(messages=[{"role": "user", "content": 3}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "image_url"}]}]),
     "messages[0].content[1].type"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
     "messages[0].content[0].text"),
    (chat(messages=[{"role": "user", "content": "x", "tool_calls": [CALL]}]),
     "messages[0].tool_calls"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"arguments": "{}"}}]}]),
     "messages[1].tool_calls[0].function.name"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]),
     "messages[1].tool_calls[0].function.arguments"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [{**CALL, "id": ""}]}]),
     "messages[1].tool_calls[0].id"),
    (chat(messages=[USER, {"role": "assistant", "tool_calls": [CALL]},
                    {"role": "tool", "content": "2"}]), "messages[2].tool_call_id"),
    (chat(tools=[{"type": "retrieval"}]), "tools[0].type"),
    (chat(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "tools[0].function.parameters"),
    (chat(tools={"f": TOOL}), "tools"),
    (chat(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
    (chat(tool_choice="required"), "tool_choice"),
    (chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "mul"}}),
     "tool_choice.function.name"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_completion_tokens="10"), "max_completion_tokens"),
    (chat(temperature="hot"), "temperature"),
    (chat(temperature=-0.5), "temperature"),
    (chat(stop=[1]), "stop[0]"),
    (chat(n=2), "n"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(top_logprobs=3), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(stream="true"), "stream"),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (chat(model=7), "model"),
])
def test_chat_request_errors_name_the_field(body, param):
    with pytest.raises(BadRequest) as e:
        parse_chat_request(body)
    assert e.value.param == param


@pytest.mark.parametrize("body, expected", [
    ({"model": "m", "prompt": "2+2="}, CompletionRequest(prompt="2+2=", model="m")),
    ({"prompt": [1, 2, 0]}, CompletionRequest(prompt=(1, 2, 0))),
    ({"prompt": "x", "logprobs": 0, "max_tokens": 4, "echo": False, "best_of": 1},
     CompletionRequest(prompt="x", sampling=Sampling(max_tokens=4, logprobs=True))),
    ({"prompt": "x", "logprobs": 3, "stream": True, "stream_options": {"include_usage": True}},
     CompletionRequest(prompt="x", sampling=Sampling(logprobs=True, top_logprobs=3,
                                                     stream=True, include_usage=True))),
])
def test_completion_request_forms(body, expected):
    assert parse_completion_request(body) == expected


@pytest.mark.parametrize("body, param", [
    ("prompt", None),
    ({}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [[1], [2]]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt[1]"),
    ({"prompt": [1, True]}, "prompt[1]"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "best_of": 2}, "best_of"),
    ({"prompt": "x", "n": 3}, "n"),
])
def test_completion_request_errors_name_the_field(body, param):
    with pytest.raises(BadRequest) as e:
        parse_completion_request(body)
    assert e.value.param == param


CALLS = (ToolCall("c1", "add", '{"a": 1}'),)
TOOL_ONLY = TurnOutput("", CALLS, "tool_calls", (7, 8), (-0.5, float("-inf")), ("<a", "b>"), 10)
TEXT = TurnOutput("hé", (), "length", (5, 6), (-0.25, -1.0), ("h", "é"), 3)
META = {"model": "m", "id": "x-1", "created": 9}


def test_chat_completion_tool_only_has_null_content_and_finite_logprobs():
    body = chat_completion(TOOL_ONLY, logprobs=True, **META)
    assert body["choices"] == [{
        "index": 0, "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        "logprobs": {"content": [
            {"token": "<a", "logprob": -0.5, "bytes": [60, 97], "top_logprobs": []},
            {"token": "b>", "logprob": -9999.0, "bytes": [98, 62], "top_logprobs": []}]}}]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    assert (body["id"], body["object"], body["created"], body["model"]) == (
        "x-1", "chat.completion", 9, "m")


def test_chat_completion_text_has_no_tool_calls_key():
    choice = chat_completion(TEXT, logprobs=False, **META)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "hé"}
    assert choice["logprobs"] is None and choice["finish_reason"] == "length"


def test_chat_chunks_order_role_content_calls_finish_usage():
    both = TurnOutput("thinking", CALLS, "tool_calls", (1, 2), (-0.1, -0.2), ("a", "b"), 4)
    chunks = chat_chunks(both, logprobs=True, include_usage=True, **META)
    deltas = [c["choices"][0]["delta"] if c["choices"] else None for c in chunks]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "thinking"},
                      {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                       "function": {"name": "add", "arguments": '{"a": 1}'}}]},
                      {}, None]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None] * 3 + ["tool_calls"]
    assert [c["choices"][0]["logprobs"] is not None for c in chunks[:4]] == [0, 1, 0, 0]
    assert [c["usage"] for c in chunks[:4]] == [None] * 4
    assert chunks[4]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}


def test_chat_chunks_without_usage_have_no_usage_key():
    chunks = chat_chunks(TOOL_ONLY, logprobs=False, include_usage=False, **META)
    assert len(chunks) == 3 and all("usage" not in c for c in chunks)


def test_text_completion_logprobs_and_offsets():
    choice = text_completion(TEXT, logprobs=True, **META)["choices"][0]
    assert choice == {"text": "hé", "index": 0, "finish_reason": "length", "logprobs": {
        "tokens": ["h", "é"], "token_logprobs": [-0.25, -1.0], "top_logprobs": None,
        "text_offset": [0, 1]}}


def test_completion_chunks_then_sse():
    chunks = completion_chunks(TEXT, logprobs=False, include_usage=False, **META)
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks] == [
        ("hé", None), ("", "length")]
    events = sse(chunks)
    assert events[-1] == b"data: [DONE]\n\n"
    assert [json.loads(e[len(b"data: "):]) for e in events[:-1]] == chunks
    assert all(e.startswith(b"data: ") and e.endswith(b"\n\n") for e in events)


def test_error_body_is_openais():
    assert error_body("no", "invalid_request_error", "messages[0].role") == {"error": {
        "message": "no", "type": "invalid_request_error", "param": "messages[0].role",
        "code": None}}
