"""A task's problems as the GRPO workflow's prompt groups: step s takes problems
[s * n, (s + 1) * n) of the training stream (source.py), each encoded once and
sampled `samples_per_prompt` times with per-sample seeds that depend only on the
run's seed and the problem, so a resumed or re-placed run samples the same."""
from __future__ import annotations

from typing import Any

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.tasks.problem import stable_seed
from dynarl.components.tasks.source import ProblemSource


class TaskPrompts:
    def __init__(self, source: ProblemSource, tokenizer: Any, *, prompts_per_step: int, samples_per_prompt: int,
                 seed: int) -> None:
        self.source, self.tokenizer = source, tokenizer
        self.prompts_per_step, self.samples_per_prompt, self.seed = prompts_per_step, samples_per_prompt, seed

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.tokenizer.eos_id,)

    def groups(self, step: int) -> list[PromptGroup]:
        n = self.prompts_per_step
        groups = []
        for index, problem in enumerate(self.source.problems(step * n, n)):
            samples = [Sample(f"{problem.id}/{k}", stable_seed(self.seed, "sample", problem.id, k))
                       for k in range(self.samples_per_prompt)]
            groups.append(PromptGroup(index, problem.id, problem.answer,
                                      self.tokenizer.encode(problem.prompt, add_bos=True), samples, problem.metadata))
        return groups
