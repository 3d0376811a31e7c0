"""A trainer worker with fault switches, for the P2P migration tests."""
import asyncio
import os
import random

import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.trainer.reshard import Resharding
from dynarl.components.trainer.threaded import ThreadedTrainer
from dynarl.components.trainer.worker import TrainerWorker

VOCAB = TINY_CONFIGS["tiny-0.5m"].vocab_size


def make_batch(seed: int, groups: int = 4, size: int = 2) -> dict:
    rng = random.Random(seed)
    ids, plens, rewards, group_ids = [], [], [], []
    for g in range(groups):
        prompt = [rng.randrange(3, VOCAB) for _ in range(4)]
        for _ in range(size):
            ids.append(prompt + [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 8))])
            plens.append(len(prompt))
            rewards.append(float(rng.randint(0, 2)))
            group_ids.append(g)
    return TrainBatch(input_ids=ids, prompt_lens=plens, rewards=rewards, group_ids=group_ids).to_wire()


class ReshardTrainer(TrainerWorker):
    """The trainer worker's resharding methods over a tiny native trainer."""

    def __init__(self, fail: str | None = None) -> None:
        self.fail = fail
        if fail == "create":
            os._exit(3)  # a new rank dies while it is being created
        self.trainer = None
        self.reshard = Resharding(self.process_group, self.device)

    async def start(self, dp_group: str | None) -> None:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
        group = self.process_group(dp_group) if dp_group else None
        self.trainer = ThreadedTrainer(await asyncio.to_thread(NativeTrainer, model, TrainerConfig(lr=1e-3), group))

    async def train(self, batch: dict) -> TrainMetrics:
        return await self.trainer.train_step(TrainBatch.from_wire(batch))

    async def reshard_warm(self) -> None:
        await self.start(None)
        await self.reshard_retire()

    async def reshard_recv_boxes(self, group, old, new):
        if self.fail == "transfer" and self.rank == 0:
            os._exit(4)  # dies midway: its peers' sends to it fail
        return await super().reshard_recv_boxes(group, old, new)

    async def reshard_install(self, step):
        if self.fail == "confirm":
            await asyncio.sleep(3600)  # never confirms
        return await super().reshard_install(step)
