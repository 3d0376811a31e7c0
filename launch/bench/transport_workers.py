"""Workers the transport benchmark drives (importable by worker processes)."""
from __future__ import annotations

import asyncio
import time

from dynarl.core.worker import Worker


class BenchWorker(Worker):
    def noop(self) -> None:
        """A plain method, like the Ray actor's no-op it is compared with."""
        return None

    async def noop_async(self) -> None:
        return None

    def cpu_times(self) -> tuple[float, float]:
        """(this process's CPU seconds, its main thread's): the rest is its other
        threads, zmq's I/O thread above all."""
        return time.process_time(), time.thread_time()

    async def produce(self, channel: str, count: int, item_bytes: int) -> float:
        import numpy as np
        ch = self.channel(channel, window=256)
        payload = np.frombuffer(b"\x01" * item_bytes, dtype=np.uint8) if item_bytes > 64 else None
        start = time.perf_counter()
        for i in range(count):
            await ch.put(i if payload is None else payload)
        await ch.flush()
        return time.perf_counter() - start

    async def consume(self, channel: str, count: int, prefetch: int) -> dict:
        ch = self.channel(channel, prefetch=prefetch)
        first = await ch.get()
        start = time.perf_counter()  # clock starts at the first item: excludes the producer's start-up
        nbytes = getattr(first, "nbytes", 0)
        for _ in range(count - 1):
            item = await ch.get()
            nbytes += getattr(item, "nbytes", 0)
        return {"seconds": time.perf_counter() - start, "items": count - 1, "bytes": nbytes}

    async def p2p_send(self, group: str, numel: int, repeats: int) -> None:
        import torch
        import torch.distributed as dist
        t = torch.ones(numel)
        for _ in range(repeats):
            await asyncio.to_thread(dist.send, t, group_dst=1, group=self.process_group(group))

    async def p2p_recv(self, group: str, numel: int, repeats: int) -> list[float]:
        import torch
        import torch.distributed as dist
        t = torch.empty(numel)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            await asyncio.to_thread(dist.recv, t, group_src=0, group=self.process_group(group))
            times.append(time.perf_counter() - start)
        return times
