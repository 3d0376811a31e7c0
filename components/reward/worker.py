"""RewardWorker: scores each sample of each chunk with the task's verifier, or with
the user's reward function (reward.function: local.py in this process, sandboxed.py in
the sandbox), and turns each group's rewards into its advantages under the trainer's
objective (trainer/advantages.py group_advantages_for; GRPO's by default: a streaming
trainer takes samples one by one, not whole groups).

A CPU component: it takes no device lock and runs beside whichever component
holds the devices, chunk by chunk as rollout finishes groups. A reward function's
failed calls cost their samples only (reward.on_error); they are counted in the
step's RewardStats and logged in one line per step.
"""
from __future__ import annotations

from typing import Any

import dynarl
from dynarl.components.experience import END, PromptGroup, Sample, group_advantages, made_of
from dynarl.components.model.spec import ModelSpec, build_tokenizer, safe_decode
from dynarl.components.reward.config import RewardSection
from dynarl.components.reward.outcome import RewardInput, Tally
from dynarl.components.reward.verifiers import make_verifier
from dynarl.components.trainer.advantages import group_advantages_for
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.stage_results import RewardStats
from dynarl.core.config_tree import build



class RewardWorker(dynarl.Worker):
    def __init__(self, model: ModelSpec, verifier: str, adv_eps: float = 1e-6,
                 engine: TrainerConfig | None = None, reward: dict[str, Any] | None = None) -> None:
        """`engine`: the trainer's settings, whose objective (and adv_eps) the advantages
        follow; None: GRPO's with `adv_eps`. `reward`: the reward section as plain data
        (its function set: that function in place of the verifier)."""
        section = build(RewardSection, reward, "reward")
        self.function: Any = None
        if section.function is not None:
            if section.sandbox:
                from dynarl.components.reward.sandboxed import SandboxReward
                self.function = SandboxReward(section)
            else:
                from dynarl.components.reward.local import LocalReward
                self.function = LocalReward(section)
            self.verify, self.backend = None, "function"
        else:
            self.verify, self.backend = make_verifier(verifier)
        self.tokenizer = build_tokenizer(model) if self.verify is not None or self.function is not None else None
        self.adv_eps = adv_eps
        self.engine = engine

    async def score(self, get: str, put: str) -> RewardStats:
        """Consumes chunks from `get` until END, puts them on `put` with a reward per sample."""
        inbox, outbox = self.channel(get), self.channel(put)
        num_samples, tally = 0, Tally()
        while (chunk := await inbox.get()) is not END:
            if self.function is not None:
                await self._score_by_function(chunk, tally)
            for group in chunk:
                for sample in group.samples:
                    if self.function is None:
                        sample.reward = self._score(sample, group)
                    num_samples += 1
                for sample, advantage in zip(group.samples, self._advantages(group)):
                    sample.advantage = advantage
                group.metadata = None  # (its last reader: the stages after this one do not carry it)
            await outbox.put(chunk, weight=len(chunk), **made_of(inbox, chunk))
        await outbox.flush()
        return RewardStats(verifier=self.backend, samples=num_samples, errors=tally.errors, timeouts=tally.timeouts,
                           first_error=tally.first_error, scores=tally.scores)

    def _advantages(self, group: PromptGroup) -> list[float]:
        rewards = [s.reward for s in group.samples]
        if self.engine is None:
            return group_advantages(rewards, self.adv_eps)
        return group_advantages_for(self.engine, rewards, [len(s.output_ids) for s in group.samples])

    def _score(self, sample: Sample, group: PromptGroup) -> float:
        if self.verify is None:
            return 0.0
        return float(self.verify(self._response(sample), group.answer))

    async def _score_by_function(self, chunk: list[PromptGroup], tally: Tally) -> None:
        """The chunk's samples through the reward function; each gets its reward."""
        samples, inputs = [], []
        for group in chunk:
            prompt = safe_decode(self.tokenizer, list(group.prompt_ids))
            for sample in group.samples:
                samples.append(sample)
                inputs.append(RewardInput(prompt=prompt, response=self._response(sample), answer=group.answer,
                                          problem_id=group.problem, sample_id=sample.id,
                                          metadata=dict(group.metadata or {})))
        for sample, outcome in zip(samples, await self.function.score(inputs), strict=True):
            sample.reward = outcome.reward
            tally.add(sample.id, outcome)

    def _response(self, sample: Sample) -> str:
        ids = [t for t in sample.output_ids if t != self.tokenizer.eos_id]
        return safe_decode(self.tokenizer, ids)
