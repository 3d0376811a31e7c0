"""RewardWorker: scores each sample of each chunk with the task's verifier.

A CPU component: it takes no device lock and runs beside whichever component
holds the devices, chunk by chunk as rollout finishes groups.
"""
from __future__ import annotations

import time

import dynarl
from dynarl.components.experience import END
from dynarl.components.model.spec import ModelSpec, build_tokenizer, safe_decode
from dynarl.components.reward.verifiers import make_verifier


class RewardWorker(dynarl.Worker):
    def __init__(self, model: dict, verifier: str) -> None:
        self.tokenizer = build_tokenizer(ModelSpec(**model))
        self.verify, self.backend = make_verifier(verifier)

    async def score(self, get: str, put: str) -> dict:
        """Consumes chunks from `get` until END, puts them on `put` with a reward per sample."""
        inbox, outbox = self.channel(get), self.channel(put)
        started, num_samples = time.perf_counter(), 0
        eos = self.tokenizer.eos_id
        while (chunk := await inbox.get()) is not END:
            for group in chunk:
                for sample in group["samples"]:
                    ids = [t for t in sample["output_ids"] if t != eos]
                    sample["reward"] = float(self.verify(safe_decode(self.tokenizer, ids), group["answer"]))
                    num_samples += 1
            await outbox.put(chunk, weight=len(chunk))
        await outbox.flush()
        return {"samples": num_samples, "busy_s": time.perf_counter() - started, "verifier": self.backend}
