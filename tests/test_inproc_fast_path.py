"""The inproc launcher answers plain calls where they arrive: a worker's plain
methods and the controller's channel operations that need no wait take no task
(the simulator's thousands of emulated ranks pay per task); async methods and
gets from an empty channel still go through one, in arrival order."""
import asyncio

import pytest

import dynarl
from dynarl import RuntimeConfig


class Adder(dynarl.Worker):
    async def setup(self):
        self.seen = []

    def add(self, a, b):
        self.seen.append(a)
        return a + b

    async def add_later(self, a, b):
        await asyncio.sleep(0)
        self.seen.append(a)
        return a + b

    def order(self):
        return list(self.seen)

    def fails(self):
        raise ValueError("no")

    async def put_and_get(self, n):
        ch = self.channel("items", prefetch=4)
        for i in range(n):
            await ch.put(i)
        await ch.flush()
        return [await ch.get() for _ in range(n)]


def counting_tasks(loop):
    created = []
    default = loop.get_task_factory()

    def factory(loop, coro, **kwargs):
        created.append(getattr(coro, "__qualname__", repr(coro)))
        return (default(loop, coro, **kwargs) if default else asyncio.Task(coro, loop=loop, **kwargs))
    loop.set_task_factory(factory)
    return created


async def test_plain_calls_take_no_task_async_ones_do():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        [adder] = (await ctl.spawn(Adder, num_ranks=1)).handles
        created = counting_tasks(asyncio.get_running_loop())
        assert [await adder.call(Adder.add, i, 1) for i in range(50)] == [i + 1 for i in range(50)]
        assert created == []
        assert await adder.call(Adder.add_later, 7, 1) == 8
        assert len(created) == 1  # the served coroutine's task
        with pytest.raises(dynarl.RemoteError, match="ValueError: no"):
            await adder.call(Adder.fails)


async def test_calls_start_in_arrival_order_across_both_paths():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        [adder] = (await ctl.spawn(Adder, num_ranks=1)).handles
        calls = [adder.call(Adder.add_later if i % 3 == 0 else Adder.add, i, 0) for i in range(12)]
        assert await asyncio.gather(*calls) == list(range(12))
        order = await adder.call(Adder.order)
        assert sorted(order) == list(range(12))
        plain = [i for i in order if i % 3]
        assert plain == sorted(plain)


async def test_channel_operations_through_the_fast_path():
    async with dynarl.Controller(RuntimeConfig(launcher="inproc")) as ctl:
        group = await ctl.spawn(Adder, num_ranks=2)
        results = await group.call(Adder.put_and_get, 20)
        assert sorted(results[0] + results[1]) == sorted(list(range(20)) * 2)
        assert len(ctl.channel("items")) == 0
