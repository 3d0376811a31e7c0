"""InferenceWorker: log-probs of the old policy (and of the reference policy when
the loss has a KL term) for every sample, chunk by chunk.

The old policy is the rollout's: both receive the same weights from the trainer
after every step, so recomputing here (a full forward, as the trainer computes
its own log-probs) keeps the PPO ratio exactly 1 at the first update instead of
carrying the small numerical gap between paged decoding and a full forward. The
reference policy is frozen at the first weights received (after warm start).

device_lock: weights and activations are all this component holds; activations
are freed after each chunk, so on-load / off-load move the weights only when the
device is not the host (on CPU both are the same memory and there is nothing to move).
"""
from __future__ import annotations

import asyncio
import time

import dynarl
from dynarl.components import weight_sync
from dynarl.components.experience import END
from dynarl.components.inference.logprobs import response_logprobs
from dynarl.components.model.io import load_pretrained, load_weights
from dynarl.components.model.spec import ModelSpec, build_model


class InferenceWorker(dynarl.Worker):
    def __init__(self, model: dict, micro_batch_size: int, with_ref: bool, bucket_bytes: int,
                 shares_device: bool = False) -> None:
        self.model = build_model(ModelSpec(**model)).eval()
        self.ref = None
        self.with_ref = with_ref
        self.micro_batch_size = micro_batch_size
        self.bucket_bytes = bucket_bytes
        self.shares_device = shares_device
        self.version = -1

    async def onload(self) -> None:
        if self.shares_device:
            self._move(self.device)

    async def offload(self) -> None:
        if self.shares_device:
            self._move("cpu")

    def _move(self, device: str) -> None:
        for m in (self.model, self.ref):
            if m is not None:
                m.to(device)

    async def receive_weights(self, group: str) -> int:
        named, version = await asyncio.to_thread(weight_sync.receive, self.process_group(group),
                                                 self.model, self.bucket_bytes, self.version)
        load_weights(self.model, named, strict=True)
        self.version = version
        return version

    async def load_reference(self, path: str) -> None:
        """The frozen reference policy (needed when with_ref)."""
        self.ref = load_pretrained(path).eval()

    async def compute_logprobs(self, get: str, put: str, *, version: int) -> dict:
        """Consumes scored chunks from `get` until END; puts them on `put` with
        old_logprobs (and ref_logprobs) on every sample."""
        if self.version != version:
            raise weight_sync.StaleWeights(f"inference holds weights v{self.version}, the step needs v{version}")
        if self.with_ref and self.ref is None:
            raise RuntimeError("with_ref is set but no reference policy was loaded (load_reference)")
        inbox, outbox = self.channel(get), self.channel(put)
        started, num_samples = time.perf_counter(), 0
        while (chunk := await inbox.get()) is not END:
            samples = [(g, s) for g in chunk for s in g["samples"]]
            prompts = [g["prompt_ids"] for g, _ in samples]
            responses = [s["output_ids"] for _, s in samples]
            old = await asyncio.to_thread(self._logprobs, self.model, prompts, responses)
            ref = await asyncio.to_thread(self._logprobs, self.ref, prompts, responses) if self.with_ref else None
            for i, (_, s) in enumerate(samples):
                s["old_logprobs"] = old[i]
                if ref is not None:
                    s["ref_logprobs"] = ref[i]
            num_samples += len(samples)
            await outbox.put(chunk, weight=len(chunk))
        await outbox.flush()
        return {"samples": num_samples, "busy_s": time.perf_counter() - started}

    def _logprobs(self, model, prompts, responses) -> list[list[float]]:
        # temperature 1: the trainer scores its ratio's numerator on the raw logits too
        return response_logprobs(model, prompts, responses, temperature=1.0, micro_batch_size=self.micro_batch_size)
