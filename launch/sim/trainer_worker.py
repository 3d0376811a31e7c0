"""SimTrainerWorker: one data-parallel trainer rank (one device), emulated.

Streaming gradient accumulation: each rank takes chunks of whole groups from the
channel as inference finishes them and runs forward/backward on them at once
(EmulatedTrainer.train_step's time); the optimizer step, after END, applies the
accumulated gradient. Ranks need not step together per chunk: they meet only in
the final gradient reduction, whose time the emulated trainer folds into its MFU.
So a trainer on devices of its own starts while rollout's tail still decodes.

A TrainBatch of range() ids: the emulated trainer reads only lengths, and a
range has the right one without building millions of ints.
"""
from __future__ import annotations

import asyncio
from typing import Any

import dynarl
from dynarl.components.experience import END
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig

from .switching import Parking, add_busy


class SimTrainerWorker(Parking, dynarl.Worker):
    def __init__(self, engine: dict, shares_device: bool = False) -> None:
        self.trainer = EmulatedTrainer(TrainerConfig(), emulation=EmulatedTrainerConfig(**engine),
                                       rank=self.rank, world_size=self.world_size)
        self.shares_device = shares_device
        self._init_home()
        self.version = 0
        self.done_samples = self.done_tokens = 0

    async def onload(self) -> None:
        if self.shares_device:  # half a role switch each way (the engine spends it)
            await self.trainer.onload()

    async def offload(self) -> None:
        if self.shares_device:
            await self.trainer.offload()

    def weight_bytes(self) -> int:
        return self.trainer.weight_bytes

    async def train(self, get: str, put: str | None, *, version: int) -> dict[str, Any]:
        inbox = self.channel(get)
        loop = asyncio.get_running_loop()
        busy: list[list[float]] = []
        samples = 0
        ids: list[str] = []
        self.done_samples = self.done_tokens = 0
        await self.home.wait()
        while (chunk := await inbox.get()) is not END:
            batch = TrainBatch(input_ids=[range(s["seq"]) for g in chunk for s in g["samples"]],
                               prompt_lens=[g["prompt_len"] for g in chunk for _ in g["samples"]],
                               rewards=[0.0 for g in chunk for _ in g["samples"]],
                               group_ids=[g["index"] for g in chunk for _ in g["samples"]])
            start = loop.time()
            await self.trainer.train_step(batch)
            add_busy(busy, start, loop.time())
            samples += len(batch)
            ids.extend(s["id"] for g in chunk for s in g["samples"])
            self.done_samples = samples
            self.done_tokens += sum(len(x) for x in batch.input_ids)
        self.version = version + 1  # the optimizer step: the new policy
        return {"samples": samples, "busy": busy, "tp": 1, "version": self.version, "ids": ids}

    def progress(self) -> dict[str, int]:
        """Samples and sequence tokens trained in the current iteration (the scheduler's view)."""
        return {"samples": self.done_samples, "tokens": self.done_tokens}
