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
