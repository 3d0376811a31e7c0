"""ProbeWorker: a worker that only measures the runtime, for `dynarl bench`
(transport, hosts, scheduler): no-op calls, channel traffic, raw torch.distributed
transfers (the floor a migration or a weight sync is compared with) and the weight
sync's own sender and receiver on a model of a given size. It copies no component."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from dynarl.core.worker import Worker


class ProbeWorker(Worker):
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

    async def raw_send(self, group: str, dst: int, numel: int) -> None:
        import torch
        import torch.distributed as dist
        t = torch.ones(numel)
        await asyncio.to_thread(dist.send, t, group_dst=dst, group=self.process_group(group))

    async def raw_recv(self, group: str, sources: list[int], numel: int) -> float:
        """Receives `numel` floats from each source, all posted at once; returns seconds."""
        import torch
        import torch.distributed as dist
        pg = self.process_group(group)
        buffers = [torch.empty(numel) for _ in sources]

        def run() -> float:
            start = time.perf_counter()
            works = [dist.irecv(b, group_src=s, group=pg) for b, s in zip(buffers, sources)]
            for w in works:
                w.wait()
            return time.perf_counter() - start
        return await asyncio.to_thread(run)

    async def weights_send(self, group: str, mb: int, repeats: int, bucket_bytes: int) -> None:
        """The weight sync's sender (components/weight_sync.py) for a model of `mb` MB."""
        from dynarl.components import weight_sync
        from dynarl.components.trainer.base import bucket_by_bytes
        buckets = list(bucket_by_bytes(_model_of(mb).named_parameters(), bucket_bytes))
        for version in range(1, repeats + 1):
            await weight_sync.send_async(self.process_group(group), *weight_sync.unbucket(buckets), version,
                                         device=self.device)

    async def weights_receive(self, group: str, mb: int, repeats: int, bucket_bytes: int) -> list[float]:
        """The weight sync's receiver; seconds per sync."""
        from dynarl.components import weight_sync
        model, times = _model_of(mb), []
        for version in range(1, repeats + 1):
            start = time.perf_counter()
            await weight_sync.receive_async(self.process_group(group), model, bucket_bytes, version - 1, version,
                                            _discard, self.device)
            times.append(time.perf_counter() - start)
        return times


def _model_of(mb: int):
    """A module of `mb` MB of float32 parameters, 4 MB each (the same names on every rank)."""
    import torch
    model = torch.nn.Module()
    for i in range(max(1, mb // 4)):
        model.register_parameter(f"w{i}", torch.nn.Parameter(torch.ones(1 << 20), requires_grad=False))
    return model


async def _discard(named: Any, version: int) -> None:
    """A probe's receiver keeps nothing: the transfer is what it measures."""
