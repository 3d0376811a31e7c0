"""The agent endpoint's refusals, live on loopback (httpx, raw sockets, the openai client):
each answered with OpenAI's error JSON and counted; the backend is never asked for a
refused request, and a crash in it is a 500 after which the server still serves."""
import asyncio
import collections
import logging

import httpx
import openai
import pytest

from fakes.agent_backend import LIMIT, TOKEN, USER, serving

AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def served():
    async with serving() as pair:
        yield pair


async def post(server, session, route, headers=AUTH, **kw):
    async with httpx.AsyncClient() as h:
        return await h.post(f"{server.base_url(session)}/{route}", headers=headers, **kw)


async def raw_exchange(port, data: bytes) -> bytes:
    """Writes `data` on a fresh connection and reads until the server closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await writer.wait_closed()
    return reply


def head(route, *lines):
    return "\r\n".join([f"POST /sessions/s1/v1/{route} HTTP/1.1", "Host: x",
                        f"Authorization: Bearer {TOKEN}", *lines, "", ""]).encode()


@pytest.mark.parametrize("headers", [{}, {"authorization": "Bearer wrong"},
                                     {"authorization": f"Basic {TOKEN}"},
                                     {"authorization": f"Bearer {TOKEN}x"},
                                     {"authorization": f"Bearer {TOKEN[:-1]}"},
                                     {"authorization": "Bearer tök".encode()}])  # not ASCII
async def test_bad_token_401(served, headers):
    server, backend = served
    r = await post(server, "s1", "chat/completions", headers=headers, json={"messages": USER})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "authentication_error"
    assert not backend.calls
    assert server.counters == collections.Counter(requests=1, unauthorized=1)


async def test_openai_client_with_a_wrong_key(served):
    server, _ = served
    async with openai.AsyncOpenAI(base_url=server.base_url("s1"), api_key="nope",
                                  max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            await c.models.list()


async def test_content_length_over_the_bound_413_unread(served):
    """The body is never sent: a server that waited to read it would hang."""
    server, backend = served
    reply = await raw_exchange(server.port, head("chat/completions",
                                                 f"Content-Length: {10**9}"))
    assert reply.startswith(b"HTTP/1.1 413 ") and b'"code":"request_too_large"' in reply
    r = await post(server, "s1", "chat/completions", content=b"x" * (LIMIT + 1))
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    ok = await post(server, "s1", "completions", content=b'{"prompt": "%s"}' % (
        b"p" * (LIMIT - 20)))
    assert ok.status_code == 200  # just under the bound
    assert len(backend.calls) == 1
    assert server.counters == collections.Counter(requests=3, too_large=2, ok=1)


async def test_chunked_body_cut_at_the_bound_413(served):
    """Chunks past the bound and no end of body: the server answers without waiting."""
    server, backend = served
    piece = b"y" * 1024
    chunks = (b"%x\r\n" % len(piece) + piece + b"\r\n") * (LIMIT // 1024 + 1)
    reply = await raw_exchange(server.port, head("completions", "Transfer-Encoding: chunked")
                               + chunks)
    assert reply.startswith(b"HTTP/1.1 413 ")

    async def pieces():  # httpx sends an async body chunked
        for _ in range(LIMIT // 1024 + 1):
            yield piece
    r = await post(server, "s1", "completions", content=pieces())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert not backend.calls
    assert server.counters == collections.Counter(requests=2, too_large=2)


async def test_a_body_that_trickles_in_is_refused_408_at_its_deadline():
    """Headers, then part of the body and nothing more: the slot is given back."""
    async with serving(read_timeout_s=0.3) as (server, backend):
        reply = await raw_exchange(server.port, head("completions", "Content-Length: 100") + b'{"prompt": ')
        assert reply.startswith(b"HTTP/1.1 408 ")
        assert not backend.calls
        assert server.counters == collections.Counter(requests=1, slow_body=1)


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"messages": NaN}', b"\xff\xfe{",
                                  b"[" * 4000 + b"]" * 4000])  # the last: too deep
async def test_invalid_json_400(served, body):
    server, backend = served
    r = await post(server, "s1", "chat/completions", content=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert not backend.calls
    assert server.counters == collections.Counter(requests=1, bad_json=1)


async def test_bad_request_400_names_the_field(served):
    server, backend = served
    async with openai.AsyncOpenAI(base_url=server.base_url("s1"), api_key=TOKEN,
                                  max_retries=0) as c:
        with pytest.raises(openai.BadRequestError) as e:
            await c.chat.completions.create(model="tiny", messages=[
                {"role": "user", "content": "a"}, {"role": "robot", "content": "b"}])
    assert e.value.param == "messages[1].role" and "robot" in e.value.message
    r = await post(server, "s1", "completions", json=["a list"])
    assert r.status_code == 400 and r.json()["error"]["param"] is None
    assert not backend.calls
    assert server.counters == collections.Counter(requests=2, bad_request=2)


async def test_unknown_session_404_and_busy_409(served):
    server, backend = served
    async with openai.AsyncOpenAI(base_url=server.base_url("gone"), api_key=TOKEN,
                                  max_retries=0) as c:
        with pytest.raises(openai.NotFoundError) as e:
            await c.chat.completions.create(model="tiny", messages=USER)
    assert e.value.code == "unknown_session"
    r = await post(server, "busy", "completions", json={"prompt": "x"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy"
    assert [(kind, session) for kind, session, _ in backend.calls] == [
        ("chat", "gone"), ("complete", "busy")]
    assert server.counters == collections.Counter(requests=2, unknown_session=1, busy=1)


async def test_no_such_route_404_or_405(served):
    server, _ = served
    async with httpx.AsyncClient(headers=AUTH) as h:
        base = f"http://127.0.0.1:{server.port}"
        missing = await h.post(f"{base}/v1/chat/completions", json={})
        wrong_method = await h.get(server.base_url("s1") + "/chat/completions")
        unauthorized = await h.post(f"{base}/v1/anything", headers={"authorization": ""})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405
    assert unauthorized.status_code == 401
    assert server.counters == collections.Counter(requests=3, no_route=2, unauthorized=1)


async def test_backend_crash_500_then_serves_on(served, caplog):
    server, backend = served
    with caplog.at_level(logging.ERROR, logger="dynarl.components.agents.server"):
        r = await post(server, "crash", "chat/completions", json={"messages": USER})
    assert r.status_code == 500
    assert r.json()["error"] == {"message": "internal error", "type": "server_error",
                                 "param": None, "code": "internal_error"}
    assert "secret internal detail" not in r.text
    assert "secret internal detail" in caplog.text  # logged with its traceback
    ok = await post(server, "s1", "chat/completions", json={"messages": USER})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "4"
    assert server.counters == collections.Counter(requests=2, failed=1, ok=1)
