NUM_GPUS = 0

import asyncio
import contextlib

import pytest

import dynarl
from dynarl import RuntimeConfig
from dynarl.core import channel_service
from dynarl.transport.data_plane import PayloadFetcher, PayloadLost, PayloadServer
from dynarl.transport.wire import Blob, Codec, RemoteRef, decode_blob, encode_blob
from conftest import assert_reaped
from workers import Consumer, Hoarder

NUMEL = 200_000  # 800 KB: above the peer-to-peer threshold


@contextlib.asynccontextmanager
async def producer_and_fetcher():
    """A producer's PayloadServer, answering only once `serve()` is called, and a
    consumer's PayloadFetcher; both closed at the end."""
    codec = Codec(b"k" * 32)
    server, fetcher = PayloadServer(codec), PayloadFetcher(codec, asyncio.ensure_future)
    serving: list[asyncio.Task] = []
    try:
        yield server, fetcher, lambda: serving.append(asyncio.ensure_future(server.serve()))
    finally:
        for task in serving:
            task.cancel()
        fetcher.close()
        server.close()


async def test_large_items_travel_peer_to_peer_and_arrive_intact():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Hoarder, num_ranks=1)
        await producer.call(Hoarder.put_large, "big", 3, NUMEL)
        channel = ctl.channel("big")
        stored = [channel.get_raw_nowait() for _ in range(3)]
        # The controller holds only references, not the bytes.
        assert all(isinstance(item, RemoteRef) and item.nbytes > 3 * NUMEL for item in stored)
        # a local job's payload servers listen on a private Unix socket, not a TCP port
        assert all(item.address.startswith("ipc://") for item in stored)
        for item in stored:
            channel.put_nowait(item)
        consumer = await ctl.spawn(Consumer, num_ranks=1)
        got = (await consumer.call(Consumer.consume, "big", 2, None, 2))[0]
        assert [g["i"] for g in got] == [0, 1]
        assert all(float(g["t"].sum()) == g["i"] * NUMEL for g in got)
        last = await channel.get()  # a controller-side get fetches peer-to-peer too
        assert last["i"] == 2 and float(last["t"][0]) == 2.0
        for _ in range(600):  # both getters released what they kept: the producer let go
            if await producer.call(Hoarder.held_bytes) == [0]:
                break
            await asyncio.sleep(0.05)
        assert await producer.call(Hoarder.held_bytes) == [0]


async def test_payloads_survive_their_producer_stopping():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Hoarder, num_ranks=1)
        await producer.call(Hoarder.put_large, "big", 2, NUMEL)
        held = ctl.channel("big").get_raw_nowait()  # as if a consumer took the ref and stalled
        await producer.stop()
        # The queued ref was swapped for the bytes; the one already taken waits at the controller.
        assert ctl.channel("big").statistics().size == 1 and len(ctl.channel_service.rehomed) == 1
        ctl.channel("big").put_nowait(held)
        consumer = await ctl.spawn(Consumer, num_ranks=1)
        got = (await consumer.call(Consumer.consume, "big", 2))[0]
        assert sorted(g["i"] for g in got) == [0, 1]
        assert not ctl.channel_service.rehomed


async def test_consumer_holding_a_ref_of_a_stopped_producer_gets_the_bytes_from_the_controller(monkeypatch):
    """The race the re-homing exists for: the consumer already has the ref when the
    producer stops, so only the controller can still serve the bytes."""
    from dynarl.transport import channel_client
    monkeypatch.setattr(channel_client, "FETCH_ATTEMPT_S", 3600.0)  # a try at the producer first would hang
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Hoarder, num_ranks=1)
        consumer = await ctl.spawn(Consumer, num_ranks=1)
        await producer.call(Hoarder.put_large, "big", 1, NUMEL)
        ref = ctl.channel("big").get_raw_nowait()
        await producer.stop()
        assert (ref.address, ref.id) in ctl.channel_service.rehomed
        client = channel_client.ChannelClient(
            "big", lambda m, a, kw: ctl.serve_worker_call(consumer.handles[0], m, a, kw),
            spawn=asyncio.ensure_future)
        value = await asyncio.wait_for(client._resolve(ref), 60)  # no fetcher: straight to the controller
        assert value["i"] == 0 and float(value["t"][0]) == 0.0


async def test_a_payload_that_arrives_after_its_fetch_timed_out_is_kept_for_the_retry():
    """If the answer comes after the fetch gave up, the consumer keeps it for its next
    attempt; the producer keeps its copy until the consumer releases it."""
    async with producer_and_fetcher() as (server, fetcher, serve):
        ref = server.offer(encode_blob({"x": 1}))
        with pytest.raises(PayloadLost, match="no answer"):
            await fetcher.fetch(ref, timeout_s=0.05)  # the producer is not serving yet
        serve()  # now it answers the request it holds
        for _ in range(3000):
            if fetcher._late:
                break
            await asyncio.sleep(0.01)
        assert fetcher._late and server.held_bytes > 0  # answered, and still held
        assert decode_blob(await fetcher.fetch(ref, timeout_s=60)) == {"x": 1} and not fetcher._late
        await fetcher.release(ref)
        for _ in range(3000):
            if server.held_bytes == 0:
                break
            await asyncio.sleep(0.01)
        assert server.held_bytes == 0  # released: the producer let it go


async def test_a_consumer_stopping_while_its_fetch_is_unanswered_loses_nothing(tmp_path):
    """A stopping consumer gives back the ref of a payload whose producer has not
    answered yet. The producer answers later, to the stopped consumer: it must still
    hold the bytes for whoever gets the ref next (it drops them only when the consumer
    that keeps the item says so)."""
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Hoarder, num_ranks=1)
        await producer.call(Hoarder.put_large, "big", 1, NUMEL)
        first = await ctl.spawn(Consumer, num_ranks=1)
        started, release = tmp_path / "frozen", tmp_path / "release"
        frozen = asyncio.ensure_future(producer.call(Hoarder.freeze, str(started), str(release)))
        for _ in range(3000):  # until the producer's loop is blocked
            if started.exists():
                break
            await asyncio.sleep(0.02)
        assert started.exists()
        getting = asyncio.ensure_future(first.call(Consumer.consume, "big", 1))
        channel = ctl.channel("big")
        for _ in range(3000):  # until the first consumer took the ref and is fetching
            if not len(channel):
                break
            await asyncio.sleep(0.02)
        assert not len(channel)
        pids = [h.pid for g in (producer, first) for h in g.handles]
        await first.stop()
        assert len(channel) == 1
        ref = channel.get_raw_nowait()
        assert isinstance(ref, RemoteRef)  # given back unfetched
        channel.put_nowait(ref)
        with pytest.raises((dynarl.RemoteError, dynarl.WorkerLost)):  # the call ended with its worker
            await getting
        release.touch()
        assert await frozen == [True]  # then the producer answered the stopped consumer's fetch
        await asyncio.sleep(0.2)
        second = await ctl.spawn(Consumer, num_ranks=1)
        got = (await asyncio.wait_for(second.call(Consumer.consume, "big", 1), 60))[0]
        assert got[0]["i"] == 0 and float(got[0]["t"].sum()) == 0.0
    assert_reaped(pids)


async def test_rehomed_payloads_are_kept_until_released_and_dropped_only_when_served_long_ago(monkeypatch):
    service = channel_service.ChannelService({})
    now = [100.0]
    monkeypatch.setattr(service, "_now", lambda: now[0])
    keep = channel_service.REHOMED_KEEP_S
    service._serve_payload("rehome", "tcp://p:1", 1, encode_blob("one"))
    # A fetch does not take it: the fetching consumer may stop before the answer reaches it.
    assert decode_blob(service._serve_payload("fetch", "tcp://p:1", 1)) == "one"
    assert decode_blob(service._serve_payload("fetch", "tcp://p:1", 1)) == "one"
    service._serve_payload("release", "tcp://p:1", 1)
    with pytest.raises(PayloadLost):
        service._serve_payload("fetch", "tcp://p:1", 1)
    # 2: never served (its ref may sit in a batch still filling); 3: served by its producer
    # before it stopped; 4: served here.
    service._serve_payload("rehome", "tcp://p:1", 2, encode_blob("two"))
    service._serve_payload("rehome", "tcp://p:1", 3, encode_blob("three"), True)
    service._serve_payload("rehome", "tcp://p:1", 4, encode_blob("four"))
    service._serve_payload("fetch", "tcp://p:1", 4)
    now[0] += keep - 1
    service._serve_payload("fetch", "tcp://p:1", 4)  # served again: its keep starts over
    assert set(service.rehomed) == {("tcp://p:1", k) for k in (2, 3, 4)} and service.rehomed_dropped == 0
    now[0] += 2
    service._serve_payload("release", "tcp://p:1", 99)  # any payload call drops what is due
    assert set(service.rehomed) == {("tcp://p:1", 2), ("tcp://p:1", 4)} and service.rehomed_dropped == 1
    now[0] += 10 * keep
    service._serve_payload("release", "tcp://p:1", 99)
    assert set(service.rehomed) == {("tcp://p:1", 2)} and service.rehomed_dropped == 2


async def test_a_second_answer_to_a_fetch_that_succeeded_is_not_kept():
    """A retry against a slow producer sends a second request; both get answered. The
    answer that comes after the fetch succeeded must not stay in the consumer's memory."""
    async with producer_and_fetcher() as (server, fetcher, serve):
        ref = server.offer(encode_blob({"x": 2}))
        with pytest.raises(PayloadLost, match="no answer"):
            await fetcher.fetch(ref, timeout_s=0.05)  # request 1 waits at the producer
        serve()
        assert decode_blob(await fetcher.fetch(ref, timeout_s=60)) == {"x": 2}  # request 2
        await asyncio.sleep(0.3)  # the other answer arrives meanwhile
        assert not fetcher._late


async def test_a_controller_side_get_waits_for_a_payload_its_stopping_producer_is_rehoming():
    """The producer has let go of its payloads and is handing them over: a controller
    fetch in that window misses at the producer and must wait for the hand-over."""
    async with producer_and_fetcher() as (server, fetcher, serve):
        service = channel_service.ChannelService({})
        service.fetcher = fetcher
        ref = server.offer(encode_blob("late"))
        serve()
        (held_ref, blob, served), = server.take_all()  # the producer's stop has begun
        assert held_ref == ref and not served

        async def hand_over_later():
            await asyncio.sleep(0.3)
            service._serve_payload("rehome", ref.address, ref.id, blob, served)

        handing = asyncio.ensure_future(hand_over_later())
        assert await asyncio.wait_for(service.resolve_item(ref), 10) == "late"
        await handing
        assert not service.rehomed


async def test_a_ref_given_back_while_its_bytes_are_rehomed_goes_back_as_the_bytes():
    service = channel_service.ChannelService({})
    ref = RemoteRef("tcp://p:1", 7, 10)
    service._serve_payload("rehome", ref.address, ref.id, encode_blob("seven"))

    class Handle:  # the consumer's handle: only its id (and that it is not lost) matters here
        lost = None

        class spec:
            worker_id = "consumer-0"

    await service.serve(Handle, "__channel__", ["give_back", "out", None, [[ref, 1.0, None]]])
    item = service.channel("out").get_raw_nowait()
    assert isinstance(item, Blob) and not service.rehomed
