"""The native inference engine: log-probs from a full torch forward (logprobs.py).

The reference policy is frozen at what `load_reference` reads (the warm start's
weights). Weights and activations are all it holds; activations are freed after
each call, so onload / offload move the weights only when the device is not the
host (on CPU both are the same memory and there is nothing to move).
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

from dynarl.components.device_memory import release_cached_memory
from dynarl.components.inference.logprobs import response_logprobs
from dynarl.components.model.io import load_pretrained, load_weights
from dynarl.components.model.qwen2 import Qwen2ForCausalLM


class NativeInference:
    def __init__(self, model: Qwen2ForCausalLM, micro_batch_size: int, device: str = "cpu") -> None:
        self.model = model.eval()
        self.ref: Qwen2ForCausalLM | None = None
        self.micro_batch_size = micro_batch_size
        self.device = device
        self.weight_version = -1

    @property
    def weights_template(self) -> Qwen2ForCausalLM:
        return self.model

    async def logprobs(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                       reference: bool = False) -> list[list[float]]:
        model = self.ref if reference else self.model
        if model is None:
            raise RuntimeError("reference log-probs asked for, but no reference policy was loaded (load_reference)")
        # temperature 1: the trainer scores its ratio's numerator on the raw logits too
        return await asyncio.to_thread(response_logprobs, model, prompts, responses, temperature=1.0,
                                       micro_batch_size=self.micro_batch_size)

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """Any subset of the parameters (the weight sync loads one bucket at a time)."""
        load_weights(self.model, named_tensors)
        self.weight_version = version

    async def load_reference(self, path: str) -> None:
        """On the policy's device, in its dtype."""
        weight = next(self.model.parameters())
        self.ref = load_pretrained(path, dtype=weight.dtype, device=weight.device).eval()

    async def onload(self) -> None:
        self._move(self.device)

    async def offload(self) -> None:
        self._move("cpu")
        release_cached_memory()

    def _move(self, device: str) -> None:
        for m in (self.model, self.ref):
            if m is not None:
                m.to(device)
