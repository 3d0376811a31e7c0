"""The sample ledger: which samples the trainer consumed at which step, exactly once.

A sample id names one (prompt, sample index) pair of the data stream, e.g.
"cu-1234/3". Before a step trains, `check` refuses a batch that holds an id the
ledger already has (or the same id twice); after the step, `commit` records it.
The ledger is appended to `ledger.jsonl` as steps commit and a copy goes into
every checkpoint; resuming restores the checkpoint's copy (steps after it were
trained into state that was lost, so they are moved to `ledger.rolled_back.jsonl`
and trained again, once, into the restored state).

Each entry also keeps a digest of the sample's generated tokens, so two runs can
be compared on what was trained, not just on which prompts.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Sequence

from dynarl.components.workflows import jsonl


class DuplicateSample(RuntimeError):
    """A sample would be trained a second time."""


@dataclass(frozen=True, slots=True)
class StepEntry:
    step: int
    sample_ids: tuple[str, ...]
    digests: tuple[int, ...]
    """crc32 of each sample's generated tokens, aligned with sample_ids."""
    versions: tuple[int, ...] = ()
    """The weight version that generated each sample (its staleness: step - version)."""

    def to_json(self) -> dict:
        return {"step": self.step, "samples": list(self.sample_ids), "digests": list(self.digests),
                "versions": list(self.versions)}

    @classmethod
    def from_json(cls, d: dict) -> "StepEntry":
        return cls(int(d["step"]), tuple(d["samples"]), tuple(d.get("digests") or ()),
                   tuple(int(v) for v in d.get("versions") or ()))


class SampleLedger:
    def __init__(self, entries: Iterable[StepEntry] = ()) -> None:
        self.entries: list[StepEntry] = []
        self._seen: dict[str, int] = {}
        for entry in entries:
            self.commit(entry)

    @property
    def num_steps(self) -> int:
        return len(self.entries)

    def check(self, step: int, sample_ids: Sequence[str]) -> None:
        """Raises DuplicateSample unless `step` is the next step and every id is new."""
        if step != self.num_steps:
            raise DuplicateSample(f"step {step} is not the next step: the ledger has {self.num_steps} steps")
        repeated = [i for i, n in Counter(sample_ids).items() if n > 1]
        if repeated:
            raise DuplicateSample(f"step {step} holds sample(s) twice: {sorted(repeated)[:5]}")
        old = [(i, self._seen[i]) for i in sample_ids if i in self._seen]
        if old:
            shown = ", ".join(f"{i} (step {s})" for i, s in old[:5])
            raise DuplicateSample(f"step {step} would train {len(old)} sample(s) again: {shown}")

    def commit(self, entry: StepEntry) -> None:
        self.check(entry.step, list(entry.sample_ids))
        self.entries.append(entry)
        for i in entry.sample_ids:
            self._seen[i] = entry.step

    def truncate(self, num_steps: int) -> list[StepEntry]:
        """Keeps the first `num_steps` steps; returns the ones dropped."""
        dropped = self.entries[num_steps:]
        for entry in dropped:
            for i in entry.sample_ids:
                del self._seen[i]
        del self.entries[num_steps:]
        return dropped

    # --- files ---------------------------------------------------------------------
    def save(self, path: str) -> None:
        """The whole ledger as JSON lines, atomically (checkpoint copy)."""
        jsonl.rewrite(path, [entry.to_json() for entry in self.entries])

    @classmethod
    def load(cls, path: str) -> "SampleLedger":
        return cls(read_entries(path))


def read_entries(path: str) -> list[StepEntry]:
    """The ledger file's steps (a torn last line, from a crash mid-append, is not one)."""
    return [StepEntry.from_json(d) for d in jsonl.read(path)]


def append_entry(path: str, entry: StepEntry) -> None:
    """Appends one committed step to the running ledger file, durably and whole."""
    jsonl.append(path, entry.to_json(), sync=True)
