"""RewardWorker: scores each sample of each chunk with the task's verifier, and
turns each group's rewards into its advantages under the trainer's objective
(trainer/advantages.py group_advantages_for; GRPO's by default: a streaming trainer
takes samples one by one, not whole groups).

A CPU component: it takes no device lock and runs beside whichever component
holds the devices, chunk by chunk as rollout finishes groups.
"""
from __future__ import annotations

import dynarl
from dynarl.components.experience import END, PromptGroup, Sample, group_advantages, made_of
from dynarl.components.model.spec import ModelSpec, build_tokenizer, safe_decode
from dynarl.components.reward.verifiers import make_verifier
from dynarl.components.trainer.advantages import group_advantages_for
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.stage_results import RewardStats


class RewardWorker(dynarl.Worker):
    def __init__(self, model: ModelSpec, verifier: str, adv_eps: float = 1e-6,
                 engine: TrainerConfig | None = None) -> None:
        """`engine`: the trainer's settings, whose objective (and adv_eps) the advantages
        follow; None: GRPO's with `adv_eps`."""
        self.verify, self.backend = make_verifier(verifier)
        self.tokenizer = build_tokenizer(model) if self.verify is not None else None
        self.adv_eps = adv_eps
        self.engine = engine

    async def score(self, get: str, put: str) -> RewardStats:
        """Consumes chunks from `get` until END, puts them on `put` with a reward per sample."""
        inbox, outbox = self.channel(get), self.channel(put)
        num_samples = 0
        while (chunk := await inbox.get()) is not END:
            for group in chunk:
                for sample in group.samples:
                    sample.reward = self._score(sample, group)
                    num_samples += 1
                for sample, advantage in zip(group.samples, self._advantages(group)):
                    sample.advantage = advantage
            await outbox.put(chunk, weight=len(chunk), **made_of(inbox, chunk))
        await outbox.flush()
        return RewardStats(verifier=self.backend, samples=num_samples)

    def _advantages(self, group: PromptGroup) -> list[float]:
        rewards = [s.reward for s in group.samples]
        if self.engine is None:
            return group_advantages(rewards, self.adv_eps)
        return group_advantages_for(self.engine, rewards, [len(s.output_ids) for s in group.samples])

    def _score(self, sample: Sample, group: PromptGroup) -> float:
        if self.verify is None:
            return 0.0
        ids = [t for t in sample.output_ids if t != self.tokenizer.eos_id]
        return float(self.verify(safe_decode(self.tokenizer, ids), group.answer))
