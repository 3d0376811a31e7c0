NUM_GPUS = 0

import asyncio

import msgpack
import numpy as np
import pytest
import torch
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dynarl
from dynarl import RuntimeConfig
from dynarl.transport import wire
from dynarl.transport.sockets import DealerClient, RouterServer
from dynarl.transport.wire import (MAC_HMAC, MAC_POLY1305, MAGIC, PROTOCOL_VERSION, Codec, MessageTooLarge,
                                   WireError, decode_blob, encode_blob)
from workers import Echo

SECRET = b"s" * 32
codec = Codec(SECRET, max_message_bytes=1 << 20)

plain = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@given(plain)
def test_plain_values_round_trip(value):
    assert codec.decode(codec.encode(value)) == value


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float16])
def test_tensors_round_trip_bitwise(dtype):
    t = (torch.arange(24, dtype=torch.float32) * 0.37).reshape(2, 3, 4).to(dtype)
    out = codec.decode(codec.encode({"t": t, "empty": torch.empty(0, 5, dtype=dtype)}))
    assert out["t"].dtype == dtype and torch.equal(out["t"], t)
    assert out["empty"].shape == (0, 5)


def test_ndarray_and_blob_round_trip():
    arr = np.arange(10, dtype=np.float64).reshape(2, 5)
    blob = encode_blob({"a": arr, "t": torch.ones(3)})
    out = codec.decode(codec.encode({"blob": blob}))
    inner = decode_blob(out["blob"])
    assert np.array_equal(inner["a"], arr) and torch.equal(inner["t"], torch.ones(3))


def test_non_wire_types_are_refused_at_the_sender():
    with pytest.raises(TypeError, match="cannot send"):
        codec.encode({"x": object()})


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=80), max_size=5))
def test_random_frames_are_rejected_never_crash(frames):
    with pytest.raises(WireError):
        codec.decode(frames)


@settings(max_examples=300)
@given(plain, st.data())
def test_any_flipped_byte_is_rejected(value, data):
    frames = [bytes(f) for f in codec.encode(value)]
    i = data.draw(st.integers(0, len(frames) - 1))
    if not frames[i]:
        return
    j = data.draw(st.integers(0, len(frames[i]) - 1))
    bit = data.draw(st.integers(0, 7))
    frame = bytearray(frames[i])
    frame[j] ^= 1 << bit
    frames[i] = bytes(frame)
    with pytest.raises(WireError):
        codec.decode(frames)


@settings(max_examples=100)
@given(plain, st.integers(1, 200))
def test_truncated_messages_are_rejected(value, cut):
    frames = [bytes(f) for f in codec.encode(value)]
    frames[0] = frames[0][:max(0, len(frames[0]) - cut)]
    with pytest.raises(WireError):
        codec.decode(frames)


def _with_header(frames, start, replacement):
    header = bytes(frames[0])
    return [header[:start] + replacement + header[start + len(replacement):], *frames[1:]]


def test_reject_reasons():
    good = codec.encode({"k": "event", "e": "x"})
    cases = {
        "truncated": [bytes(good[0][:10])],
        "bad_magic": _with_header(good, 0, b"XXX"),
        "wrong_version": _with_header(good, 3, bytes([PROTOCOL_VERSION + 1])),
        "unauthenticated": Codec(b"other-secret-0123456789").encode({"k": "event", "e": "x"}),
        "oversized": Codec(SECRET).encode({"blob": b"x" * (2 << 20)}),
    }
    for reason, frames in cases.items():
        with pytest.raises(WireError) as info:
            codec.decode(frames)
        assert info.value.reason == reason
    switched = _with_header(good, 4, bytes([MAC_POLY1305]))  # flip the mac kind
    with pytest.raises(WireError, match="unauthenticated"):
        codec.decode(switched)


def test_large_payloads_use_poly1305_and_small_ones_hmac():
    assert bytes(codec.encode({"t": torch.zeros(100)})[0])[4] == MAC_HMAC
    roomy = Codec(SECRET)
    big = roomy.encode({"t": torch.zeros(1 << 18)})
    assert bytes(big[0])[4] == MAC_POLY1305
    assert torch.equal(roomy.decode(big)["t"], torch.zeros(1 << 18))


def test_a_large_body_under_hmac_is_checked_without_a_copy_and_still_authenticated(monkeypatch):
    """A big msgpack body with no tensor frames keeps the HMAC kind; its tag is the same
    one-shot or streamed (the receiver streams it: no joined copy of what a peer sent)."""
    message = codec.encode({"b": b"x" * (200 << 10)})
    assert bytes(message[0])[4] == MAC_HMAC
    import hmac
    one_shot, real = [], hmac.digest
    monkeypatch.setattr(hmac, "digest", lambda key, msg, digest: (one_shot.append(len(msg)), real(key, msg, digest))[1])
    assert codec.decode(message) == {"b": b"x" * (200 << 10)}
    assert one_shot == []  # streamed, not joined into one buffer
    assert len(codec.encode({"b": b"small"})[0]) and codec.decode(codec.encode({"b": b"small"})) == {"b": b"small"}
    assert one_shot and max(one_shot) < 1024  # a small one still takes the one-shot path
    tampered = bytearray(message[0])
    tampered[-1] ^= 1
    with pytest.raises(WireError, match="unauthenticated"):
        codec.decode([bytes(tampered)])


def test_a_message_over_the_bound_is_refused_at_the_sender():
    with pytest.raises(MessageTooLarge, match=r"over runtime.max_message_bytes \(1048576\)"):
        codec.encode({"t": torch.zeros(300_000)})
    with pytest.raises(MessageTooLarge):
        codec.encode({"b": b"x" * (1 << 20)})


def test_malformed_body_with_valid_mac_is_rejected():
    """An authenticated peer with a bug: a tensor ext pointing at a missing frame."""
    ext = msgpack.ExtType(1, msgpack.packb([5, "float32", [2]]))
    body = msgpack.packb({"t": ext})
    nonce = b"n" * 16
    header = MAGIC + bytes([PROTOCOL_VERSION, MAC_HMAC]) + nonce + codec._tag(MAC_HMAC, nonce, body, []) + body
    with pytest.raises(WireError) as info:
        codec.decode([header])
    assert info.value.reason == "malformed"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.lists(st.lists(st.binary(max_size=64), min_size=1, max_size=4), min_size=1, max_size=10))
def test_controller_keeps_serving_through_garbage(garbage):
    asyncio.run(_garbage_then_call(garbage))


async def _garbage_then_call(garbage):
    config = RuntimeConfig(launcher="local", max_message_bytes=1 << 20)
    async with dynarl.Controller(config) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        identity = group.handles[0].spec.worker_id.encode()
        ctx = zmq.asyncio.Context()
        intruder = ctx.socket(zmq.DEALER)
        intruder.setsockopt(zmq.IDENTITY, identity + b"-intruder")
        # (a local job binds no TCP port: only this user's processes reach its IPC socket)
        assert ctl.router.address is None and ctl.router.local_address.startswith("ipc://")
        intruder.connect(ctl.router.local_address)
        big = Codec(SECRET, max_message_bytes=1 << 30)
        # every frame under the 1 MB bound, together over it: read, then refused
        oversized = big.encode({"b": [torch.zeros(150_000), torch.zeros(150_000)]})
        # one frame over it: ZeroMQ closes the connection before allocating the frame
        # (the peer reconnects), and the controller counts the closed connection
        too_big_frame = big.encode({"b": torch.zeros(300_000)})
        for frames in [*garbage, oversized, Codec(b"wrong-secret-0123456789").encode({"k": "call"}), too_big_frame]:
            await intruder.send_multipart(frames)
        expected = len(garbage) + 3
        for _ in range(3000):
            if ctl.router.rejects.total >= expected:
                break
            await asyncio.sleep(0.01)
        assert ctl.router.rejects.total == expected, ctl.router.rejects.counts
        assert ctl.router.rejects.counts["oversized"] == 1
        assert ctl.router.rejects.counts["dropped_connection"] == 1
        assert ctl.router.rejects.counts["unauthenticated"] >= 1
        assert (await group.call(Echo.hello, 3))[0]["x"] == 3  # still serving
        intruder.close(linger=0)
        ctx.term()


async def test_the_router_reports_a_known_peer_whose_connection_closes():
    """on_disconnect hears a peer that delivered an authenticated message (the agent
    launcher ends its calls to a node agent so); a stranger's closed connection is
    only counted."""
    router = RouterServer(codec, bind=None)
    closed: list[bytes] = []
    router.on_disconnect = closed.append
    router.on_unknown = lambda identity, body: None
    serving = asyncio.ensure_future(router.serve())
    known = DealerClient(codec, router.local_address, b"agent/1")
    stranger = DealerClient(Codec(b"w" * 32), router.local_address, b"agent/2")
    try:
        await known.send({"k": "event", "e": "hello", "d": {}})
        await stranger.send({"k": "event", "e": "hello", "d": {}})
        for _ in range(3000):
            if b"agent/1" in router.last_seen and router.rejects.total:
                break
            await asyncio.sleep(0.01)
        assert list(router.last_seen) == [b"agent/1"] and closed == []
        known.close()
        stranger.close()
        for _ in range(3000):
            if closed and router.rejects.counts["dropped_connection"]:
                break
            await asyncio.sleep(0.01)
        assert closed == [b"agent/1"] and router.rejects.counts["dropped_connection"] == 1
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        router.close()


def _nonce(sender: bytes, counter: int) -> bytes:
    return sender + counter.to_bytes(8, "little")


@pytest.mark.parametrize("arrivals, taken", [
    # (sender, counter) in arrival order -> which were taken
    ([(b"a" * 8, 0), (b"a" * 8, 1), (b"a" * 8, 2)], [True, True, True]),
    ([(b"a" * 8, 5), (b"a" * 8, 5)], [True, False]),                     # resent: dropped
    ([(b"a" * 8, 5), (b"a" * 8, 3), (b"a" * 8, 4), (b"a" * 8, 3)], [True, True, True, False]),  # late, once
    ([(b"a" * 8, 10), (b"a" * 8, 2)], [True, True]),                     # 8 behind: inside a width of 16
    ([(b"a" * 8, 20), (b"a" * 8, 4)], [True, False]),                    # 16 behind: outside it
    ([(b"a" * 8, 1), (b"b" * 8, 1), (b"a" * 8, 1)], [True, True, False]),  # senders apart
    ([(b"a" * 8, 1), (b"a" * 8, 100), (b"a" * 8, 1)], [True, True, False]),  # a jump past the width
])
def test_replay_window(arrivals, taken):
    window = wire.ReplayWindow(width=16)
    assert [window.admit(_nonce(s, c)) for s, c in arrivals] == taken


def test_replay_window_forgets_the_longest_known_sender_past_its_bound():
    window = wire.ReplayWindow(width=16, max_senders=2)
    assert window.admit(_nonce(b"a" * 8, 1)) and window.admit(_nonce(b"b" * 8, 1))
    assert window.admit(_nonce(b"c" * 8, 1))  # "a" forgotten
    assert not window.admit(_nonce(b"b" * 8, 1)) and not window.admit(_nonce(b"c" * 8, 1))


def test_a_message_resent_to_the_same_socket_is_refused():
    window = wire.ReplayWindow()
    message = codec.encode({"k": "call", "m": "train"})
    assert codec.decode(message, window) == {"k": "call", "m": "train"}
    with pytest.raises(WireError, match="replayed"):
        codec.decode(message, window)
    assert codec.decode(message, wire.ReplayWindow()) == {"k": "call", "m": "train"}  # another socket's own


async def test_a_captured_message_resent_to_the_controller_is_dropped_and_counted():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        group = await ctl.spawn(Echo, num_ranks=1)
        ctx = zmq.asyncio.Context()
        replayer = ctx.socket(zmq.DEALER)
        replayer.setsockopt(zmq.IDENTITY, b"replayer")
        replayer.connect(ctl.router.local_address)
        captured = Codec(ctl.secret).encode({"k": "event", "e": "heartbeat", "d": {}})
        for _ in range(3):
            await replayer.send_multipart(captured)
        for _ in range(3000):
            if ctl.router.rejects.total >= 3:
                break
            await asyncio.sleep(0.01)
        # the first is authentic (from a peer the controller does not know), the resends replayed
        assert ctl.router.rejects.counts["replayed"] == 2, ctl.router.rejects.counts
        assert (await group.call(Echo.hello, 5))[0]["x"] == 5
        replayer.close(linger=0)
        ctx.term()


async def test_workers_that_stop_normally_are_not_reported_as_rejected(caplog):
    """A worker's connections close at its stop; each has delivered an authenticated
    message by then (the heartbeat thread beats once at connect), so none is counted as
    a dropped connection, even for workers that live less than one heartbeat interval."""
    config = RuntimeConfig(launcher="local", heartbeat_interval_s=30.0, heartbeat_timeout_s=60.0)
    async with dynarl.Controller(config) as ctl:
        closed: list[bytes] = []
        ctl.router.on_disconnect = closed.append
        group = await ctl.spawn(Echo, num_ranks=2)
        assert [r["x"] for r in await group.call(Echo.hello, 1)] == [1, 1]
        await group.stop()
        # two connections a worker (its dealer, its heartbeat thread's): each close is
        # heard either as a known peer's or as a rejection
        for _ in range(1000):
            if len(closed) + ctl.router.rejects.total >= 4:
                break
            await asyncio.sleep(0.01)
        assert ctl.router.rejects.counts == {} and len(closed) == 4, (closed, ctl.router.rejects.counts)
    assert "rejected" not in caplog.text
