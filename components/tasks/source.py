"""The training stream: problem i of a run is a pure function of (seed, i).

That is what makes a run reproducible across placement modes and resumable from
a step number alone: step s trains on problems [s * n, (s + 1) * n), whatever
ran before it and wherever it ran. A dataset is walked in epochs, each a fresh
seeded permutation of its usable rows; the problem id carries the epoch, so the
same row in another epoch is another sample. The supervised warm start draws
from a separate stream ("warm"), so it never overlaps the RL samples.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.tasks.calc import CalcConfig, CalcTask
from dynarl.components.tasks.count_up import CountUpConfig, CountUpTask
from dynarl.components.tasks.dataset import Chat, Check, DatasetConfig, load_dataset
from dynarl.components.tasks.problem import Problem, stable_seed


@dataclass(kw_only=True, slots=True)
class TaskConfig:
    kind: Literal["count_up", "calc", "dataset"] = "count_up"
    """count_up: the built-in generated task; calc: the built-in agentic (tool-using)
    task, trained by `workflow: agentic`; dataset: rows of task.dataset.path."""
    count_up: CountUpConfig = field(default_factory=CountUpConfig)
    calc: CalcConfig = field(default_factory=CalcConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    verifier: Literal["auto", "count_up", "exact", "math", "none"] = "auto"
    """auto: count_up for the built-in task, exact for calc, math (math-verify) for a dataset;
    none: every reward 0 (a simulated workload, `dynarl sim`)."""

    @property
    def resolved_verifier(self) -> str:
        if self.verifier != "auto":
            return self.verifier
        return {"count_up": "count_up", "calc": "exact"}.get(self.kind, "math")


class ProblemSource:
    def __init__(self, config: TaskConfig, seed: int, check: Check | None = None, chat: Chat | None = None) -> None:
        self.config = config
        self.seed = seed
        self.report = ""
        """What loading found (rows used/skipped); empty for the built-in task."""
        self.skipped: list[tuple[int, str]] = []
        """(row number, reason) of each malformed dataset row."""
        self._task: CountUpTask | CalcTask | None = None
        self._rows: list[Problem] = []
        if config.kind == "count_up":
            self._task = CountUpTask(config.count_up, seed)
        elif config.kind == "calc":
            self._task = CalcTask(config.calc, seed)
        else:
            dataset = load_dataset(config.dataset, check, chat)
            self._rows = dataset.problems
            self.report = dataset.report()
            self.skipped = dataset.skipped
        self._perms: dict[tuple[str, int], list[int]] = {}

    def problems(self, start: int, count: int) -> list[Problem]:
        """Problems [start, start + count) of the training stream."""
        return [self._problem("train", i) for i in range(start, start + count)]

    def warmup_problems(self, start: int, count: int) -> list[Problem]:
        return [self._problem("warm", i) for i in range(start, start + count)]

    def _problem(self, stream: str, index: int) -> Problem:
        if isinstance(self._task, CalcTask):
            return self._task.problem(index, "calc" if stream == "train" else "warm")
        if self._task is not None:
            return self._task.problem(index, "cu" if stream == "train" else "warm")
        epoch, position = divmod(index, len(self._rows))
        row = self._rows[self._permutation(stream, epoch)[position]]
        prefix = "e" if stream == "train" else "w"
        return Problem(f"{prefix}{epoch}:{row.id}", row.prompt, row.answer, row.metadata)

    def _permutation(self, stream: str, epoch: int) -> list[int]:
        key = (stream, epoch)
        perm = self._perms.get(key)
        if perm is None:
            perm = list(range(len(self._rows)))
            random.Random(stable_seed(self.seed, stream, epoch)).shuffle(perm)
            self._perms[key] = perm
        return perm
