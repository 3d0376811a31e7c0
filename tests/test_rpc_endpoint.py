"""RpcEndpoint's fast path for plain methods, driven directly (no sockets)."""
NUM_GPUS = 0

import asyncio

from dynarl.transport.rpc import RpcEndpoint


def make_endpoint(order: list[str], sent: list[dict], *, accept: bool = True) -> RpcEndpoint:
    async def send(body: dict) -> None:
        sent.append(body)

    def send_now(body: dict) -> bool:
        if accept:
            sent.append(body)
        return accept

    async def serve(method: str, args: list, kwargs: dict):
        order.append(f"start {method}")
        await asyncio.sleep(0)
        return method

    def plain_method(method: str):
        if not method.startswith("plain"):
            return None
        return lambda: order.append(f"run {method}") or method

    return RpcEndpoint("peer", send, serve=serve, plain_method=plain_method, send_now=send_now)


def call(i: int, method: str) -> dict:
    return {"k": "call", "id": i, "m": method, "a": [], "kw": {}}


async def test_a_plain_call_is_answered_where_it_arrives():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)
    endpoint.handle(call(1, "plain_a"))
    assert order == ["run plain_a"] and sent == [{"k": "reply", "id": 1, "v": "plain_a"}]
    assert endpoint.num_serving == 0 and endpoint.calls_served == 1


async def test_a_plain_call_does_not_overtake_an_earlier_async_one():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)
    endpoint.handle(call(1, "async_a"))   # spawned, not started yet
    endpoint.handle(call(2, "plain_b"))   # must wait its turn
    assert order == []
    await asyncio.sleep(0.01)
    assert order == ["start async_a", "start plain_b"]  # queued behind it, on the task path
    assert sorted(b["id"] for b in sent) == [1, 2]
    endpoint.handle(call(3, "plain_c"))   # nothing waiting any more: answered at once
    assert order[-1] == "run plain_c" and sent[-1]["id"] == 3


async def test_a_full_socket_sends_the_reply_later():
    order, sent = [], []
    endpoint = make_endpoint(order, sent, accept=False)
    endpoint.handle(call(1, "plain_a"))
    assert sent == [] and endpoint.num_serving == 1
    await asyncio.sleep(0.01)
    assert sent == [{"k": "reply", "id": 1, "v": "plain_a"}] and endpoint.num_serving == 0


async def test_a_call_cancelled_before_it_starts_does_not_block_the_fast_path():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)
    endpoint.handle(call(1, "async_a"))
    endpoint.handle({"k": "cancel", "id": 1})
    await asyncio.sleep(0.01)
    endpoint.handle(call(2, "plain_b"))
    assert order[-1] == "run plain_b" and sent[-1]["id"] == 2


def make_wrapping_endpoint(order: list[str], sent: list[dict]) -> RpcEndpoint:
    """plain_wrapped hands back a coroutine (a sync wrapper around async code)."""
    endpoint = make_endpoint(order, sent)

    async def body():
        order.append("wrapped body starts")
        return "wrapped"

    def plain_method(method: str):
        if method == "plain_wrapped":
            return body
        return None if not method.startswith("plain") else (lambda: order.append(f"run {method}") or method)

    endpoint._plain_method = plain_method
    return endpoint


async def test_an_awaitable_from_a_plain_method_starts_before_later_calls():
    order, sent = [], []
    endpoint = make_wrapping_endpoint(order, sent)
    endpoint.handle(call(1, "plain_wrapped"))
    endpoint.handle(call(2, "plain_b"))
    await asyncio.sleep(0.01)
    assert order == ["wrapped body starts", "start plain_b"]
    assert {b["id"]: b["v"] for b in sent} == {1: "wrapped", 2: "plain_b"}
    assert endpoint.num_serving == 0 and endpoint.calls_served == 2


async def test_a_caller_woken_by_a_reply_resumes_before_a_plain_call_that_came_after_it():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)

    async def caller():
        await endpoint.call("remote")
        order.append("caller resumed")

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)  # the call is out
    call_id = sent[-1]["id"]
    endpoint.handle({"k": "reply", "id": call_id, "v": None})  # one drain: the reply, then a call
    endpoint.handle(call(7, "plain_b"))
    await task
    await asyncio.sleep(0.01)
    assert order == ["caller resumed", "start plain_b"]
    endpoint.handle(call(8, "plain_c"))  # the next turn of the loop: the fast path again
    assert order[-1] == "run plain_c"


async def test_a_reply_that_cannot_be_encoded_becomes_an_error():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)

    def send_now(body: dict) -> bool:
        if body["k"] == "reply":
            raise ValueError("too deep")
        sent.append(body)
        return True

    endpoint._send_now = send_now
    endpoint.handle(call(1, "plain_a"))
    await asyncio.sleep(0.01)
    assert [(b["k"], b["id"], b["type"]) for b in sent] == [("error", 1, "ValueError")]
    assert endpoint.num_serving == 0 and endpoint.calls_served == 1


async def test_a_task_cancelled_before_it_starts_is_not_left_serving():
    order, sent = [], []
    endpoint = make_endpoint(order, sent)
    endpoint.handle(call(1, "async_a"))
    endpoint.handle({"k": "cancel", "id": 1})
    await asyncio.sleep(0.01)
    assert endpoint.num_serving == 0 and order == [] and sent == []
