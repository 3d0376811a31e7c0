"""SimInferenceWorker: one device computing old-policy log-probs, emulated.

The same loop as components/inference/worker.py (chunks in until END), spending
EmulatedInference's forward time per chunk over each sample's full sequence
(prompt, generations, tool output). Out go single samples, not groups: once
scored, GRPO samples are independent, so the trainer's data-parallel ranks can
balance them one by one (as a real trainer balances tokens over ranks).
"""
from __future__ import annotations

import asyncio
from typing import Any

import dynarl
from dynarl.components.experience import END
from dynarl.components.inference.emulated import EmulatedInference, EmulatedInferenceConfig

from .switching import Parking, add_busy


class SimInferenceWorker(Parking, dynarl.Worker):
    def __init__(self, engine: dict, shares_device: bool = False) -> None:
        self.engine = EmulatedInference(EmulatedInferenceConfig(**engine))
        self.shares_device = shares_device
        self._init_home()
        self.done_samples = self.done_tokens = 0

    async def onload(self) -> None:
        if self.shares_device:  # half a role switch each way (the engine spends it)
            await self.engine.onload()

    async def offload(self) -> None:
        if self.shares_device:
            await self.engine.offload()

    async def receive_weights(self, version: int, num_bytes: int) -> int:
        await self.engine.update_weights(num_bytes, version)
        return version

    async def compute_logprobs(self, get: str, put: str, *, version: int) -> dict[str, Any]:
        if self.engine.weight_version != version:
            raise RuntimeError(f"inference holds weights v{self.engine.weight_version}, the step needs v{version}")
        inbox, outbox = self.channel(get), self.channel(put)
        loop = asyncio.get_running_loop()
        busy: list[list[float]] = []
        samples = 0
        self.done_samples = self.done_tokens = 0
        await self.home.wait()
        while (chunk := await inbox.get()) is not END:
            lens = [s["seq"] for g in chunk for s in g["samples"]]
            start = loop.time()
            await self.engine.forward(lens)
            add_busy(busy, start, loop.time())
            samples += len(lens)
            self.done_samples = samples
            self.done_tokens += sum(lens)
            for g in chunk:  # scored samples are independent: the trainer's ranks balance them one by one
                for sample in g["samples"]:
                    await outbox.put([{"index": g["index"], "prompt_len": g["prompt_len"], "samples": [sample]}])
        await outbox.flush()
        return {"samples": samples, "busy": busy, "tp": 1}

    def progress(self) -> dict[str, int]:
        """Samples and sequence tokens scored in the current iteration (the scheduler's view)."""
        return {"samples": self.done_samples, "tokens": self.done_tokens}
