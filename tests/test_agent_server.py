"""The agent endpoint's HTTP layer, live on loopback: the official openai client against
AgentServer over a canned backend (tests/fakes/agent_backend.py), and the server's life:
start on asyncio or uvloop, signal handlers left alone, a graceful and idempotent stop
that leaves no task, connection or socket. Refusals: test_agent_server_refusals.py; the
pure JSON functions: test_agent_openai_json.py."""
import asyncio
import collections
import signal
import socket
import time

import httpx
import openai
import pytest

from dynarl.components.agents.messages import ChatMessage, ToolCall, ToolSpec
from dynarl.components.agents.server import AgentServer
from fakes.agent_backend import ANSWER, CALLING, TOKEN, USER, CannedBackend, serving


@pytest.fixture
async def served():
    async with serving() as pair:
        yield pair


def client(server, session="s1"):
    return openai.AsyncOpenAI(base_url=server.base_url(session), api_key=TOKEN, max_retries=0)


async def until(condition, timeout=10.0):
    async def poll():
        while not condition():
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


async def test_chat_text_with_logprobs(served):
    server, backend = served
    async with client(server) as c:
        r = await c.chat.completions.create(model="tiny", messages=USER, logprobs=True,
                                            max_tokens=8, temperature=0.7, seed=1)
    choice = r.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (
        "4", None, "stop")
    assert [(t.token, t.logprob) for t in choice.logprobs.content] == [
        ("4", -0.5), ("<|end|>", -0.25)]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.model) == (12, 2, "tiny")
    [(kind, session, request)] = backend.calls
    assert (kind, session, request.messages) == ("chat", "s1", (ChatMessage("user", "2+2?"),))
    assert (request.sampling.max_tokens, request.sampling.temperature,
            request.sampling.logprobs) == (8, 0.7, True)
    assert server.counters == collections.Counter(requests=1, ok=1)


async def test_chat_tool_calls_round_trip(served):
    server, backend = served
    backend.answer = CALLING
    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}}}}]
    async with client(server) as c:
        r = await c.chat.completions.create(model="tiny", messages=USER, tools=tools)
        message = r.choices[0].message
        assert message.content is None and r.choices[0].finish_reason == "tool_calls"
        [call] = message.tool_calls
        assert (call.id, call.function.name, call.function.arguments) == (
            "call_1", "add", '{"a": 2, "b": 2}')
        backend.answer = ANSWER  # the agent sends the call's result back
        history = USER + [message.model_dump(), {"role": "tool", "tool_call_id": call.id,
                                                 "content": "4"}]
        r = await c.chat.completions.create(model="tiny", messages=history, tools=tools,
                                            tool_choice="auto")
    assert r.choices[0].message.content == "4"
    first, second = backend.calls[0][2], backend.calls[1][2]
    assert first.tools == (ToolSpec("add", "", tools[0]["function"]["parameters"]),)
    assert second.messages[1:] == (
        ChatMessage("assistant", "", (ToolCall("call_1", "add", '{"a": 2, "b": 2}'),)),
        ChatMessage("tool", "4", tool_call_id="call_1"))
    assert server.counters == collections.Counter(requests=2, ok=2)


@pytest.mark.parametrize("answer", [ANSWER, CALLING])
async def test_streaming_chat_assembles(served, answer):
    server, backend = served
    backend.answer = answer
    async with client(server) as c:
        stream = await c.chat.completions.create(
            model="tiny", messages=USER, stream=True, logprobs=True,
            stream_options={"include_usage": True})
        content, calls, finish, tokens, usage, roles = "", {}, None, [], None, []
        async for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                roles += [choice.delta.role] if choice.delta.role else []
                content += choice.delta.content or ""
                for d in choice.delta.tool_calls or []:
                    calls[d.index] = (d.id, d.function.name, d.function.arguments)
                tokens += [t.token for t in (choice.logprobs.content if choice.logprobs else [])]
                finish = choice.finish_reason or finish
    assert (roles, content, finish, tokens) == (
        ["assistant"], answer.text, answer.finish_reason, list(answer.tokens))
    assert list(calls.values()) == [(c.id, c.name, c.arguments) for c in answer.tool_calls]
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        answer.prompt_tokens, len(answer.token_ids))
    assert backend.calls[0][2].sampling.stream


@pytest.mark.parametrize("prompt, stream", [("2+2=", False), ([17, 4, 99], False),
                                            ("2+2=", True)])
async def test_completions(served, prompt, stream):
    server, backend = served
    async with client(server) as c:
        r = await c.completions.create(model="tiny", prompt=prompt, logprobs=0, stream=stream)
        if stream:
            chunks = [chunk async for chunk in r]
            text = "".join(ch.choices[0].text for ch in chunks)
            finish = chunks[-1].choices[0].finish_reason
            logprobs = chunks[0].choices[0].logprobs
        else:
            text, finish, logprobs = r.choices[0].text, r.choices[0].finish_reason, \
                r.choices[0].logprobs
    assert (text, finish) == ("4", "stop")
    assert (logprobs.tokens, logprobs.token_logprobs) == (["4", "<|end|>"], [-0.5, -0.25])
    [(kind, session, request)] = backend.calls
    expected = tuple(prompt) if isinstance(prompt, list) else prompt
    assert (kind, session, request.prompt, request.sampling.logprobs) == (
        "complete", "s1", expected, True)


async def test_models_lists_the_model(served):
    server, _ = served
    async with client(server) as c:
        assert [m.id for m in (await c.models.list()).data] == ["tiny"]


def other_tasks():
    return asyncio.all_tasks() - {asyncio.current_task()}


async def test_stop_closes_socket_connections_and_tasks():
    async with serving() as (server, _):
        sock, models = server._socket, server.base_url("s1") + "/models"
        async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as h:
            assert (await h.get(models)).status_code == 200  # its connection stays open
            await server.stop()
            assert sock.fileno() == -1 and not other_tasks()
            with pytest.raises(httpx.ConnectError):  # the kept-alive one was closed too
                await h.get(models)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", server.port)
        await server.stop()  # again: nothing to do


async def test_stop_lets_a_request_under_way_finish():
    async with serving() as (server, backend):
        async with httpx.AsyncClient() as h:
            request = asyncio.create_task(h.post(
                server.base_url("slow") + "/chat/completions", json={"messages": USER},
                headers={"authorization": f"Bearer {TOKEN}"}))
            await until(lambda: backend.calls)
            stopping = asyncio.create_task(server.stop())
            await asyncio.sleep(0.3)
            assert not stopping.done()
            with pytest.raises(OSError):  # no longer listening meanwhile
                await asyncio.open_connection("127.0.0.1", server.port)
            backend.release.set()
            assert (await request).json()["choices"][0]["message"]["content"] == "4"
            await stopping
        assert not other_tasks()


async def test_stop_cancels_what_outlasts_the_grace():
    async with serving(grace_s=0.2) as (server, backend):
        async with httpx.AsyncClient() as h:
            request = asyncio.create_task(h.post(
                server.base_url("slow") + "/chat/completions", json={"messages": USER},
                headers={"authorization": f"Bearer {TOKEN}"}))
            await until(lambda: backend.calls)
            began = time.monotonic()
            await server.stop()
            assert time.monotonic() - began < 3
            reply = (await asyncio.gather(request, return_exceptions=True))[0]
            assert isinstance(reply, httpx.HTTPError) or reply.status_code == 500
        assert not other_tasks()


async def test_signal_handlers_are_left_alone():
    def handlers():
        return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def mine(signum, frame):
        pass
    before = handlers()
    previous = signal.signal(signal.SIGTERM, mine)
    try:
        async with serving() as (server, _):
            async with client(server) as c:  # serve() is running: uvicorn's would be set now
                await c.models.list()
            assert signal.getsignal(signal.SIGTERM) is mine
            assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


async def test_port_in_use_raises_from_start():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = AgentServer(CannedBackend(), TOKEN, port=taken.getsockname()[1])
        with pytest.raises(OSError):
            await server.start()
    assert not other_tasks()
    with pytest.raises(ValueError, match="token"):
        AgentServer(CannedBackend(), "")


def test_serves_on_uvloop():
    import uvloop  # a dependency: the controller's loop

    async def main():
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        async with serving() as (server, _):
            async with client(server) as c:
                r = await c.chat.completions.create(model="tiny", messages=USER)
            sock = server._socket
        assert not other_tasks()
        return r.choices[0].message.content, sock, server.counters

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        content, sock, counters = runner.run(main())
    assert content == "4" and sock.fileno() == -1
    assert counters == collections.Counter(requests=1, ok=1)


def test_base_url():
    server = AgentServer(CannedBackend(), TOKEN, host="::1", port=8000)
    assert server.base_url("ep-7.a_b~") == "http://[::1]:8000/sessions/ep-7.a_b~/v1"
    for bad in ("a/b", "a b", "", "é"):
        with pytest.raises(ValueError, match="session id"):
            server.base_url(bad)
