NUM_GPUS = 0

import asyncio

import pytest

import dynarl
from dynarl import RuntimeConfig
from dynarl.transport.channel import Channel, WouldBlock
from workers import Consumer, Producer


async def test_backpressure_blocks_put_until_get():
    ch = Channel("c", capacity=2)
    await ch.put(1)
    await ch.put(2)
    blocked = asyncio.ensure_future(ch.put(3))
    await asyncio.sleep(0)
    assert not blocked.done() and ch.statistics().waiting_putters == 1
    assert await ch.get() == 1
    await asyncio.sleep(0)
    assert blocked.done()
    assert [await ch.get(), await ch.get()] == [2, 3]


async def test_keys_are_separate_queues():
    ch = Channel("c")
    await ch.put("a1", key="a")
    await ch.put("b1", key="b")
    with pytest.raises(WouldBlock):
        ch.get_nowait()
    assert await ch.get("b") == "b1" and await ch.get("a") == "a1"


async def test_waiting_consumers_balanced_by_weight():
    ch = Channel("c")
    got: dict[str, list] = {"x": [], "y": []}

    async def consume(name, n):
        for _ in range(n):
            got[name].append(await ch.get(consumer=name))

    tasks = [asyncio.ensure_future(consume("x", 3)), asyncio.ensure_future(consume("y", 3))]
    await asyncio.sleep(0)
    for item, weight in [("heavy", 10), ("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)]:
        await ch.put(item, weight=weight)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # "heavy" went to x; the light ones then went to y until y caught up or ran out.
    assert got["x"][0] == "heavy" and got["y"] == ["a", "b", "c"]
    stats = ch.statistics()
    assert stats.served_weight == {"x": 12.0, "y": 3.0}


async def test_affinity_prefers_the_named_consumer():
    ch = Channel("c")
    waiting_x = asyncio.ensure_future(ch.get(consumer="x"))
    waiting_y = asyncio.ensure_future(ch.get(consumer="y"))
    await asyncio.sleep(0)
    await ch.put("for-y", affinity="y")
    await asyncio.sleep(0)
    assert waiting_y.done() and waiting_y.result() == "for-y" and not waiting_x.done()
    await ch.put("any")
    assert await waiting_x == "any"
    # Queued items: a consumer takes what it prefers first, else the oldest.
    await ch.put("for-x", affinity="x")
    await ch.put("plain")
    assert await ch.get(consumer="z") == "plain"


@pytest.mark.parametrize("target,weights,expected", [
    pytest.param(3, [1, 1, 1, 1], 3, id="exact"),
    pytest.param(2.5, [2, 2, 2], 2, id="overshoot"),
    pytest.param(1, [5], 1, id="single-heavy"),
])
async def test_get_batch_by_weight(target, weights, expected):
    ch = Channel("c")
    for i, w in enumerate(weights):
        await ch.put(i, weight=w)
    assert len(await ch.get_batch(target)) == expected


async def test_close_drains_then_raises():
    ch = Channel("c")
    await ch.put(1)
    waiter_later = None
    ch.close()
    with pytest.raises(dynarl.ChannelClosed):
        await ch.put(2)
    assert await ch.get() == 1
    with pytest.raises(dynarl.ChannelClosed):
        await ch.get()
    ch2 = Channel("c2")
    waiter_later = asyncio.ensure_future(ch2.get())
    await asyncio.sleep(0)
    ch2.close()
    with pytest.raises(dynarl.ChannelClosed):
        await waiter_later
    ch3 = Channel("c3")
    await ch3.put(1)
    ch3.close()
    assert await ch3.get_batch(5) == [1]  # a short last batch


@pytest.mark.parametrize("launcher", ["local", "inproc"])
async def test_worker_to_worker_through_channel(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        producer = await ctl.spawn(Producer, num_ranks=1)
        consumers = await ctl.spawn(Consumer, num_ranks=2)
        items = [{"i": i, "text": "x" * i} for i in range(40)]
        consumed, produced = await asyncio.gather(consumers.call(Consumer.consume, "work", 20, prefetch=4),
                                                  producer.call(Producer.produce, "work", items))
        assert produced == [40]
        got = sorted((x["i"] for part in consumed for x in part))
        assert got == list(range(40))
        assert ctl.channel("work").statistics().gets == 40


async def test_controller_side_get_decodes_worker_items():
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Producer, num_ranks=1)
        await producer.call(Producer.produce, "out", [{"a": [1, 2]}, "two"])
        ch = ctl.channel("out")
        assert [await ch.get(), await ch.get()] == [{"a": [1, 2]}, "two"]


async def test_100mb_tensor_crosses_a_channel_intact():
    numel = 100 * (1 << 20) // 4
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        producer = await ctl.spawn(Producer, num_ranks=1)
        consumer = await ctl.spawn(Consumer, num_ranks=1)
        received, sent = await asyncio.gather(consumer.call(Consumer.consume_tensor, "big"),
                                              producer.call(Producer.produce_tensor, "big", numel, 7))
        assert received[0]["numel"] == numel
        assert received[0]["sum"] == received[0]["expected"] == sent[0]


async def test_many_waiting_consumers_stay_fast_and_balanced():
    """Thousands of waiting getters (a 4096-device simulation): each put is O(log n).
    (Its speed is no wall-clock bound here: a loaded machine stretches it.)"""
    ch = Channel("c", capacity=100_000)
    consumers = [f"w{i}" for i in range(2000)]
    got: dict[str, int] = {}

    async def consume(name):
        for _ in range(5):
            await ch.get(consumer=name)
            got[name] = got.get(name, 0) + 1

    tasks = [asyncio.ensure_future(consume(c)) for c in consumers]
    await asyncio.sleep(0)
    for i in range(10_000):
        ch.put_nowait(i)
        if i % 500 == 0:
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert set(got.values()) == {5}  # equal weights: every consumer served equally
    assert all(len(q) <= 1 for q in ch._by_consumer.values())  # no pile-up of served getters


# --- nothing lost: cancelled gets, stopping workers, cancelled putters ------------------

async def test_a_get_cancelled_after_its_item_was_handed_over_gives_it_back():
    ch = Channel("c")
    getter = asyncio.ensure_future(ch.get())
    await asyncio.sleep(0)
    await ch.put("x")  # handed straight to the waiting getter...
    getter.cancel()    # ...which is cancelled before it runs again
    await asyncio.gather(getter, return_exceptions=True)
    assert getter.cancelled()
    assert len(ch) == 1 and ch.statistics().gets == 0
    assert await ch.get() == "x"


async def test_a_cancelled_get_batch_takes_nothing():
    ch = Channel("c")
    await ch.put("a")
    await ch.put("b")
    batch = asyncio.ensure_future(ch.get_batch(5))
    await asyncio.sleep(0)
    batch.cancel()
    await asyncio.gather(batch, return_exceptions=True)
    assert len(ch) == 2 and ch.statistics().gets == 0
    assert [await ch.get(), await ch.get()] == ["a", "b"]


async def test_a_putter_cancelled_after_being_woken_passes_the_room_on():
    ch = Channel("c", capacity=1)
    await ch.put(0)
    first = asyncio.ensure_future(ch.put(1))
    second = asyncio.ensure_future(ch.put(2))
    await asyncio.sleep(0)
    assert await ch.get() == 0  # room for one: wakes `first`...
    first.cancel()              # ...which is cancelled before it runs
    await asyncio.gather(first, return_exceptions=True)
    await asyncio.wait_for(second, 10)  # `second` got the room instead of waiting forever
    assert await ch.get() == 2


async def test_puts_under_backpressure_land_in_the_order_they_came():
    """A put that finds room while an earlier one waits, or has been woken and not run
    yet, goes behind it: a driver's END for a rank cannot overtake that rank's last turn
    (the agentic run on SGLang that hung on a turn queued behind its rank's END)."""
    ch = Channel("c", capacity=1)
    await ch.put("x", key="r")
    turn = asyncio.ensure_future(ch.put("turn", key="r"))
    await asyncio.sleep(0)

    async def release() -> None:
        assert ch.get_nowait("r") == "x"  # room for one: wakes `turn`, which has not run yet...
        await ch.put("END", key="r")      # ...when the END comes, in the same tick

    end = asyncio.ensure_future(release())
    await asyncio.wait_for(turn, 10)
    await asyncio.sleep(0)
    assert not end.done()
    assert await ch.get(key="r") == "turn"
    await asyncio.wait_for(end, 10)
    assert await ch.get(key="r") == "END"


async def test_bookkeeping_of_used_keys_is_dropped():
    ch = Channel("c")
    for k in range(1000):
        getter = asyncio.ensure_future(ch.get(key=k))
        await asyncio.sleep(0)
        await ch.put(k, key=k)
        assert await getter == k
    assert not ch._queues and not ch._getters and not ch._by_consumer


async def test_asking_an_existing_channel_for_another_capacity_is_an_error():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        assert ctl.channel("c", capacity=4).capacity == 4
        assert ctl.channel("c").capacity == 4
        with pytest.raises(ValueError, match="capacity 4, not 8"):
            ctl.channel("c", capacity=8)


@pytest.mark.parametrize("launcher", ["local", "inproc"])
async def test_a_stopping_consumer_gives_back_what_it_prefetched(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        ch = ctl.channel("work")
        for i in range(6):
            await ch.put(i)
        consumers = await ctl.spawn(Consumer, num_ranks=1)
        assert await consumers.call(Consumer.consume, "work", 1, prefetch=4) == [[0]]
        assert len(ch) == 2  # 1 used, 3 prefetched
        await consumers.stop()
        assert len(ch) == 5 and [await ch.get() for _ in range(5)] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("launcher", ["local", "inproc"])
async def test_a_prefetching_consumer_takes_one_end_and_leaves_the_next_for_another(launcher):
    """stages.py puts one END (None) per consumer behind the work: a get of many stops at an END."""
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        ch = ctl.channel("work")
        for item in (0, 1, None, None, 2):
            await ch.put(item)
        consumers = await ctl.spawn(Consumer, num_ranks=1)
        assert await consumers.call(Consumer.consume, "work", 3, prefetch=8) == [[0, 1, None]]
        assert len(ch) == 2 and await ch.get() is None and await ch.get() == 2
        await consumers.stop()


@pytest.mark.parametrize("launcher", ["local", "inproc"])
async def test_a_stopping_producer_delivers_what_it_had_not_sent_even_to_a_full_channel(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        ch = ctl.channel("work", capacity=2)
        producers = await ctl.spawn(Consumer, num_ranks=1)
        assert await producers.call(Consumer.produce_without_flush, "work", list(range(5))) == [5]
        await asyncio.wait_for(producers.stop(), 60)
        assert [await ch.get() for _ in range(5)] == list(range(5))


@pytest.mark.parametrize("launcher", ["local", "inproc"])
async def test_worker_gets_given_up_lose_no_item(launcher):
    async with dynarl.Controller(RuntimeConfig(launcher=launcher)) as ctl:
        consumers = await ctl.spawn(Consumer, num_ranks=1)
        ch = ctl.channel("work")
        consuming = asyncio.ensure_future(consumers.call(Consumer.consume_with_timeouts, "work", 10, 0.01))
        for i in range(10):
            await asyncio.sleep(0.013)  # items arrive around the consumer's time-outs
            await ch.put(i)
        assert sorted((await asyncio.wait_for(consuming, 60))[0]) == list(range(10))
        assert len(ch) == 0


async def test_a_full_channel_still_takes_the_controllers_put_after_a_worker_filled_it():
    """A worker's flusher that had nothing more to send must not take the wake-up a
    waiting putter needs (capacity 1: the worker's last item fills the channel)."""
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        ch = ctl.channel("work", capacity=1)
        producer = await ctl.spawn(Producer, num_ranks=1)
        assert await producer.call(Producer.produce, "work", ["a"]) == [1]
        end = asyncio.ensure_future(ch.put("END"))
        await asyncio.sleep(0.01)
        assert await ch.get() == "a"
        await asyncio.wait_for(end, 30)
        assert await ch.get() == "END"


@pytest.mark.parametrize("round_", range(3))
async def test_stopping_a_consumer_in_the_middle_of_its_gets_loses_nothing(round_, tmp_path):
    path = str(tmp_path / "eaten")
    async with dynarl.Controller(RuntimeConfig(launcher="local")) as ctl:
        work = ctl.channel("work")
        consumer = await ctl.spawn(Consumer, num_ranks=1)
        eating = asyncio.ensure_future(consumer.call(Consumer.eat_to_file, "work", path))
        n = 0
        for _ in range(50):
            await work.put(n)
            n += 1
            await asyncio.sleep(0.0002)
        stopping = asyncio.ensure_future(consumer.stop())
        while not stopping.done():  # items keep arriving while the consumer is being stopped
            await work.put(n)
            n += 1
            await asyncio.sleep(0.0002)
        await asyncio.gather(eating, return_exceptions=True)
        left = [work.get_nowait() for _ in range(len(work))]
    eaten = [int(line) for line in open(path)]
    assert sorted(eaten + left) == list(range(n)), sorted(set(range(n)) - set(eaten + left))  # each once


async def test_a_room_waiter_that_waits_again_is_still_told():
    ch = Channel("c", capacity=1)
    await ch.put("a")
    waiter = asyncio.ensure_future(ch.wait_room())
    await asyncio.sleep(0)
    assert await ch.get() == "a"  # wakes the waiter...
    ch.put_nowait("b")            # ...but the room is gone before it runs: it waits again
    await asyncio.sleep(0)
    assert not waiter.done()
    assert await ch.get() == "b"
    await asyncio.wait_for(waiter, 10)


async def test_a_stop_whose_waiting_get_ends_while_it_is_abandoned_still_gives_back():
    """The channel ends the waiting get (abandon) and the get's fill is gone from the
    consumer's books before the stop looks again: the stop must not trip over that."""
    from dynarl.transport.channel_client import ChannelClient
    fill_answered = asyncio.Event()
    ops = []

    async def call(method, args, kwargs):
        op = args[0]
        ops.append(op)
        if op == "get_many":
            await fill_answered.wait()
            return []  # ended by the abandon, without an item
        if op == "abandon":
            fill_answered.set()
            for _ in range(5):  # the fill finishes before this reply arrives
                await asyncio.sleep(0)
            return 1
        return None

    client = ChannelClient("work", call, prefetch=2, spawn=asyncio.ensure_future)
    getting = asyncio.ensure_future(client.get())
    await asyncio.sleep(0.01)
    assert await client.give_back() == 0 and ops == ["get_many", "abandon"]
    with pytest.raises(dynarl.ChannelClosed):
        await getting
