"""Worker classes used by the runtime tests (importable by worker processes)."""
import asyncio
import os

import dynarl


class Echo(dynarl.Worker):
    def __init__(self, tag: str = "t") -> None:
        self.tag = tag
        self.events: list[str] = []
        self.num_sleeps = 0
        self.num_met = 0
        self.all_met = asyncio.Event()

    async def hello(self, x):
        return {"rank": self.rank, "world": self.world_size, "pid": os.getpid(), "x": x, "tag": self.tag}

    def parent(self):
        return os.getppid()

    def env(self, name):
        return os.environ.get(name)

    async def boom(self):
        raise ValueError("bad things happened here")

    async def sleep(self, seconds):
        self.num_sleeps += 1
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            self.events.append("cancelled")
            raise
        return self.rank

    def sleeps_begun(self):
        return self.num_sleeps

    async def meet(self, n):
        """Returns once `n` calls of it are under way at the same time: calls run one
        after another never return."""
        self.num_met += 1
        if self.num_met == n:
            self.all_met.set()
        await self.all_met.wait()
        return self.num_met

    async def block(self, seconds):
        import time
        time.sleep(seconds)  # blocks the worker's loop on purpose
        return self.rank

    async def onload(self):
        self.events.append("onload")

    async def offload(self):
        self.events.append("offload")

    async def record(self, label):
        self.events.append(label)

    def get_events(self):
        return self.events

    def plain_boom(self):
        raise KeyError("plain failure here")

    def plain_later(self, x):
        return self.hello(x)  # a plain method handing back an awaitable

    def unsendable(self):
        return object()

    def plain_rank(self):
        return self.rank

    @property
    def broken(self):
        raise RuntimeError("property failed")

    def deep(self):
        value = []
        for _ in range(2000):  # deeper than msgpack packs
            value = [value]
        return value


class BlockingSetup(dynarl.Worker):
    """A setup() stuck in a blocking call (a hung collective init, say)."""

    async def setup(self):
        import time
        time.sleep(60)


class Parent(dynarl.Worker):
    def start_child(self):
        """A process this worker starts (in its session) and leaves running."""
        import subprocess
        self.child = subprocess.Popen(["sleep", "1000"])
        return self.child.pid


class Marker(dynarl.Worker):
    """Writes a file in teardown(): evidence of an ordered stop."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def teardown(self):
        with open(f"{self.path}.{self.rank}", "w") as f:
            f.write("torn down")


class SlowTeardown(dynarl.Worker):
    """Its teardown takes `hold_s`; it writes when it began and ended."""

    def __init__(self, path: str, hold_s: float = 1.0) -> None:
        self.path, self.hold_s = path, hold_s

    async def teardown(self):
        import time
        began = time.time()
        await asyncio.sleep(self.hold_s)
        with open(self.path, "w") as f:
            f.write(f"{began} {time.time()}")


class Producer(dynarl.Worker):
    async def produce(self, channel, items, key=None):
        ch = self.channel(channel)
        for item in items:
            await ch.put(item, key=key)
        await ch.flush()
        return len(items)

    async def produce_tensor(self, channel, numel, seed):
        import torch
        g = torch.Generator().manual_seed(seed)
        t = torch.randn(numel, generator=g)
        ch = self.channel(channel)
        await ch.put({"tensor": t, "sum": float(t.double().sum())})
        await ch.flush()
        return float(t.double().sum())


class Consumer(dynarl.Worker):
    async def consume(self, channel, n, key=None, prefetch=1):
        ch = self.channel(channel, prefetch=prefetch)
        return [await ch.get(key) for _ in range(n)]

    async def consume_with_timeouts(self, channel, n, timeout_s):
        """Gets n items, each get given up after timeout_s and retried (the item a
        given-up get was handed must not be lost)."""
        ch, got = self.channel(channel), []
        while len(got) < n:
            try:
                got.append(await asyncio.wait_for(ch.get(), timeout_s))
            except asyncio.TimeoutError:
                pass
        return got

    async def eat_to_file(self, channel, path):
        """Gets until stopped, writing each item down at once (a consumer that is
        nearly always waiting in get())."""
        inbox = self.channel(channel, prefetch=2)
        with open(path, "a") as f:
            while True:
                f.write(f"{await inbox.get()}\n")
                f.flush()

    async def produce_without_flush(self, channel, items):
        """Puts and returns at once: the stop must deliver what is still unsent."""
        ch = self.channel(channel, window=len(items))
        for item in items:
            await ch.put(item)
        return len(items)

    async def consume_tensor(self, channel):
        item = await self.channel(channel).get()
        t = item["tensor"]
        return {"numel": t.numel(), "sum": float(t.double().sum()), "expected": item["sum"]}


class Collective(dynarl.Worker):
    """Tensor traffic over runtime process groups."""

    async def all_reduce(self, group, value):
        import torch
        import torch.distributed as dist
        t = torch.full((4,), float(value))
        await asyncio.to_thread(dist.all_reduce, t, group=self.process_group(group))
        return t.tolist()

    async def group_rank(self, group):
        return [self.process_group(group).rank(), self.process_group(group).size()]

    async def store_value(self, group, key):
        """`key` of the group's store as this member reads it (gloo's rendezvous: "0/<rank>")."""
        import torch.distributed as dist
        _, store = dist.distributed_c10d._world.pg_map[self.process_group(group)]
        return await asyncio.to_thread(store.get, key)

    async def send_big(self, group, dst, numel, seed):
        import torch
        import torch.distributed as dist
        t = torch.randn(numel, generator=torch.Generator().manual_seed(seed))
        await asyncio.to_thread(dist.send, t, group_dst=dst, group=self.process_group(group))
        return float(t.double().sum())

    async def recv_big(self, group, src, numel):
        import torch
        import torch.distributed as dist
        t = torch.empty(numel)
        await asyncio.to_thread(dist.recv, t, group_src=src, group=self.process_group(group))
        return float(t.double().sum())


class Hoarder(dynarl.Worker):
    """Puts large items, then can be stopped before anyone fetches them."""

    async def put_large(self, channel, count, numel):
        import torch
        ch = self.channel(channel)
        for i in range(count):
            await ch.put({"i": i, "t": torch.full((numel,), float(i))})
        await ch.flush()
        return count

    def held_bytes(self):
        """Bytes of payloads this rank still holds for consumers."""
        return self._runtime._payloads.held_bytes

    def freeze(self, started, release, max_s=120.0):
        """Blocks this rank's loop (a long native call: its payloads go unanswered) from
        the moment it writes the file `started` until the file `release` exists."""
        import time
        open(started, "w").close()
        deadline = time.monotonic() + max_s
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)
        return os.path.exists(release)


class Counter(dynarl.Worker):
    """Keeps a count across a Reboot migration."""

    def __init__(self, fail_on_devices=None, fail_restore=False) -> None:
        if fail_on_devices and self.devices[0] in fail_on_devices:
            raise RuntimeError(f"device {self.devices[0]} is broken")
        self.count = 0
        self.fail_restore = fail_restore

    def add(self, n):
        self.count += n
        return self.count

    def where(self):
        return {"pid": os.getpid(), "devices": self.devices}

    def reboot_state(self):
        return {"count": self.count}

    def reboot_restore(self, states):
        if self.fail_restore:
            raise RuntimeError("restore failed (fault injection)")
        self.count = sum(s["count"] for s in states)


class StuckOffload(Echo):
    """An Echo whose offload fails (a device that still holds work)."""

    async def offload(self):
        raise RuntimeError("offload: work still running")
