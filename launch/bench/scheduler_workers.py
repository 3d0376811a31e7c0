"""Workers the scheduler benchmark drives (importable by worker processes)."""
from __future__ import annotations

import asyncio
import time

import torch
import torch.distributed as dist

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.trainer.reshard import ReshardableTrainer
from dynarl.core.worker import Worker


class BenchTrainer(ReshardableTrainer, Worker):
    def __init__(self, model: str = "tiny-4m") -> None:
        self.model_name = model
        self.trainer = None

    async def start(self, dp_group: str | None) -> int:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(TINY_CONFIGS[self.model_name])
        group = self.process_group(dp_group) if dp_group else None
        self.trainer = await asyncio.to_thread(NativeTrainer, model, TrainerConfig(), group)
        return self.trainer.layout().total_numel

    async def raw_send(self, group: str, dst: int, numel: int) -> None:
        t = torch.ones(numel)
        await asyncio.to_thread(dist.send, t, group_dst=dst, group=self.process_group(group))

    async def raw_recv(self, group: str, sources: list[int], numel: int) -> float:
        """Receives `numel` floats from each source, all posted at once; returns seconds."""
        pg = self.process_group(group)
        buffers = [torch.empty(numel) for _ in sources]

        def run() -> float:
            start = time.perf_counter()
            works = [dist.irecv(b, group_src=s, group=pg) for b, s in zip(buffers, sources)]
            for w in works:
                w.wait()
            return time.perf_counter() - start
        return await asyncio.to_thread(run)
