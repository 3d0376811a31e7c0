"""What flows between the stages of an RL step, and how it becomes a TrainBatch.

A PromptGroup is one prompt and its samples; each Sample is filled in stage by
stage (rollout: its tokens; reward: reward and advantage; inference: log-probs).
Both are typed records that cross the wire as themselves (transport/wire.py
register_struct). A channel item is a *chunk*: a list of finished groups, put
with weight = its number of groups. The chunk size is the elastic-pipelining
granularity: the next stage starts on a chunk as soon as it is complete. END
(None) tells one consumer rank that its step's input is over.

A simulated workload's samples also carry `max_new_tokens`, the response length the
emulated engine makes (or, multi-turn, their script in `turns`); their ids and
log-probs are LazyLists (rollout/emulated/tokens.py) that only a reader builds, so
their batches may carry lengths alone (`stream_batch`).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Sequence

import numpy as np

from dynarl.transport.wire import register_struct

from dynarl.components.trainer.base import TrainBatch

END = None


@register_struct(16)
@dataclass(slots=True)
class Sample:
    """One response to its group's prompt."""
    id: str
    seed: int
    max_new_tokens: int | None = None
    """The response length a simulated sample asks for (its own max_tokens)."""
    turns: list[list] | None = None
    """A simulated multi-turn sample's script: [gen_tokens, tool_latency_s, obs_tokens] per turn."""
    output_ids: Sequence[int] = ()
    logprobs: Sequence[float] = ()
    finish: str = ""
    version: int = -1
    """The weight version that generated it (-1: not generated yet)."""
    mask: list[int] | None = None
    """Multi-turn: 1 on generated tokens, 0 on tool observations."""
    reward: float | None = None
    advantage: float | None = None
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    segments: list[list[int]] | None = None
    """Partial rollout: [first token, end token, weight version] of each run of its
    tokens that one policy generated, when it was generated over several steps (None:
    in one). `version` is then the oldest of them: how stale the sample is."""
    episode: list | None = None
    """Partial rollout of a multi-turn episode carried unfinished into a later step: its
    progress beyond the tokens (components/workflows/episodes.py EpisodeState's wire)."""
    teacher_logprobs: list[float] | None = None
    """The teacher's log-probs of its tokens (algorithm.name opd: the inference stage's)."""

    def to_wire(self) -> list:
        return [getattr(self, f) for f in _SAMPLE_FIELDS]

    @property
    def partial(self) -> bool:
        """Some tokens generated and not finished (carried to a later step)."""
        return not self.finish and len(self.output_ids) > 0

    def carry(self, output_ids: Sequence[int], logprobs: Sequence[float], version: int) -> None:
        """Its generation stops unfinished: the tokens so far, which `version` made
        since the last segment, stay with it for a later step to continue."""
        self._segment(len(output_ids), version)
        self.output_ids, self.logprobs, self.finish = list(output_ids), list(logprobs), ""

    def finished(self, output_ids: Sequence[int], logprobs: Sequence[float], finish: str, version: int) -> None:
        """Its generation ended: every token is in; with segments, `version` made the
        last run and the sample's version is its oldest."""
        self.output_ids, self.logprobs, self.finish = output_ids, logprobs, finish
        if self.segments is None:
            self.version = version
            return
        self._segment(len(output_ids), version)
        self.version = min(v for _, _, v in self.segments)

    def _segment(self, end: int, version: int) -> None:
        """The tokens from the last segment's end to `end` were made by `version`."""
        start = self.segments[-1][1] if self.segments else 0
        if end > start:
            self.segments = [*(self.segments or []), [start, end, int(version)]]

    def restart(self) -> None:
        """Its tokens so far are dropped: it is generated again from the prompt."""
        self.output_ids, self.logprobs, self.finish, self.version, self.segments = (), (), "", -1, None
        self.mask, self.episode = None, None  # (an episode starts again from its first turn)

    @classmethod
    def from_wire(cls, values: list) -> "Sample":
        if not isinstance(values, list) or len(values) != len(_SAMPLE_FIELDS):
            raise ValueError(f"expected {len(_SAMPLE_FIELDS)} fields")
        s = cls(*values)
        if not isinstance(s.id, str) or not isinstance(s.seed, int):
            raise ValueError("id must be a str and seed an int")
        return s


_SAMPLE_FIELDS = tuple(f.name for f in fields(Sample))


@register_struct(17)
@dataclass(slots=True)
class PromptGroup:
    """One prompt and its samples (the GRPO group); `index`: its position in the step."""
    index: int
    problem: str
    answer: str
    prompt_ids: Sequence[int]
    samples: list[Sample]
    metadata: dict | None = None
    """A dataset row's other fields (tasks/dataset.py), for a reward function
    (reward.function); None: none. The reward stage, its last reader, drops it."""

    def to_wire(self) -> list:
        return [self.index, self.problem, self.answer, self.prompt_ids, self.samples, self.metadata]

    def to_json(self) -> list:
        """JSON-safe (a checkpoint's file): the wire fields, samples as their field lists."""
        return [self.index, self.problem, self.answer, list(self.prompt_ids),
                [[list(v) if isinstance(v, tuple) else v for v in s.to_wire()] for s in self.samples], self.metadata]

    @classmethod
    def from_json(cls, values: list) -> "PromptGroup":
        """(A sample written before `segments`, `episode` or `teacher_logprobs` existed has
        fields fewer: None; a group written before `metadata` existed, none.)"""
        index, problem, answer, prompt_ids, samples, *metadata = values
        n = len(_SAMPLE_FIELDS)
        return cls.from_wire([index, problem, answer, prompt_ids,
                              [Sample.from_wire(s + [None] * (n - len(s)) if n - 3 <= len(s) < n else s)
                               for s in samples], *metadata])

    @classmethod
    def from_wire(cls, values: list) -> "PromptGroup":
        if not isinstance(values, list) or len(values) not in (5, 6):
            raise ValueError("expected 6 fields")
        g = cls(*values)
        if not isinstance(g.index, int) or not isinstance(g.samples, list) or \
                not all(isinstance(s, Sample) for s in g.samples):
            raise ValueError("index must be an int and samples a list of Sample")
        if g.metadata is not None and not isinstance(g.metadata, dict):
            raise ValueError("metadata must be a mapping or None")
        return g


def train_batch(groups: Sequence[PromptGroup], with_ref: bool, behaviour: bool = False) -> TrainBatch:
    """The canonical batch: groups by index, samples in order, so the same groups
    give the same batch whatever order the stages finished them in. `behaviour`: the
    rollout's own log-probs go along (behav_logprobs: an older policy generated them)."""
    pairs = [(g, s) for g in sorted(groups, key=lambda g: g.index) for s in g.samples]
    return TrainBatch(**_sequences(pairs, with_ref, behaviour), rewards=[float(s.reward) for _, s in pairs],
                      group_ids=[int(g.index) for g, _ in pairs])


def _sequences(pairs: Sequence[tuple[PromptGroup, Sample]], with_ref: bool, behaviour: bool) -> dict[str, Any]:
    """The TrainBatch fields of each (group, sample): its tokens and log-probs (the
    teacher's where the samples have them: algorithm.name opd)."""
    taught = bool(pairs) and pairs[0][1].teacher_logprobs is not None
    return {"input_ids": [list(g.prompt_ids) + list(s.output_ids) for g, s in pairs],
            "prompt_lens": [len(g.prompt_ids) for g, _ in pairs],
            "old_logprobs": old_logprobs(s for _, s in pairs),
            "behav_logprobs": [[float(x) for x in s.logprobs] for _, s in pairs] if behaviour else None,
            "ref_logprobs": [list(s.ref_logprobs) for _, s in pairs] if with_ref else None,
            "teacher_logprobs": [list(s.teacher_logprobs) for _, s in pairs] if taught else None}


def old_logprobs(samples: Iterable[Sample]) -> list[list[float]] | None:
    """Each sample's old log-probs; None where the step had no inference stage (the
    trainer's forward gives them: workflows/old_logprobs.py). All or none."""
    olds = [s.old_logprobs for s in samples]
    if all(o is None for o in olds):
        return None
    if any(o is None for o in olds):
        raise ValueError("some samples have old_logprobs and some do not")
    return [list(o) for o in olds if o is not None]


def sample_ids(groups: Sequence[PromptGroup]) -> list[str]:
    return [s.id for g in sorted(groups, key=lambda g: g.index) for s in g.samples]


def samples(groups: Sequence[PromptGroup]) -> list[Sample]:
    return [s for g in groups for s in g.samples]


def group_advantages(rewards: Sequence[float], eps: float) -> list[float]:
    """GRPO advantages of one group: (r - mean) / (std + eps), std with Bessel's
    correction; a group of one, or one whose rewards are all equal, gets 0 (as
    trainer/native/losses.py grpo_advantages, which the trainer uses on whole batches)."""
    r = np.asarray(rewards, dtype=np.float32).astype(np.float64)  # a batch's rewards are float32
    if r.size < 2 or bool((r == r[0]).all()):
        return [0.0] * int(r.size)
    return ((r - r.mean()) / (r.std(ddof=1) + eps)).astype(np.float32).tolist()


def stream_batch(groups: Sequence[PromptGroup], with_ref: bool, lengths_only: bool = False,
                 behaviour: bool = False) -> TrainBatch:
    """A streaming trainer's part of the step: its samples with the advantages the
    reward stage set (so a part may hold any samples, not only whole groups). With
    `lengths_only` (an engine that reads lengths alone) each sequence is a range;
    `behaviour`: the rollout's own log-probs go along (train_batch's)."""
    samples = [(g, s) for g in groups for s in g.samples]
    prompt_lens = [len(g.prompt_ids) for g, _ in samples]
    advantages = [float(s.advantage) for _, s in samples]
    if lengths_only:
        return TrainBatch(input_ids=[range(p + len(s.output_ids)) for p, (_, s) in zip(prompt_lens, samples)],
                          prompt_lens=prompt_lens, advantages=advantages)
    masks = [list(s.mask) for _, s in samples] if samples and samples[0][1].mask is not None else None
    return TrainBatch(**_sequences(samples, with_ref, behaviour), response_mask=masks, advantages=advantages)


@register_struct(72)
@dataclass(slots=True)
class Trained:
    """What a streaming trainer rank trained in one step, per sample (a wire record, by
    its fields: stage_results.py TrainerStats carries it): the ledger's ids and
    digests, the step metrics' inputs. `merge` joins the ranks'."""
    ids: list[str] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def add(self, groups: Sequence[PromptGroup], digests: bool = True) -> None:
        """`digests`: crc32 of each sample's tokens; False (lengths-only samples): of its length."""
        for g in groups:
            for s in g.samples:
                out = s.output_ids
                self.ids.append(s.id)
                self.digests.append(_digest(out) if digests else zlib.crc32(str(len(out)).encode()))
                self.rewards.append(float(s.reward))
                self.lengths.append(len(out))
                self.finishes.append(str(s.finish))
                self.versions.append(int(s.version))

    @classmethod
    def merge(cls, parts: Sequence["Trained"]) -> "Trained":
        out = cls()
        for part in parts:
            for f in fields(out):
                getattr(out, f.name).extend(getattr(part, f.name))
        return out


def _digest(output_ids: Sequence[int]) -> int:
    return zlib.crc32(np.asarray(output_ids, dtype=np.int64).tobytes())


def made_of(inbox: Any, chunk: list[PromptGroup]) -> dict[str, Any]:
    """A put's `made_of` (its groups' indexes) where the chunk's groups came from a
    channel that keeps custody of them (transport/custody.py Custody: the put releases
    them), else nothing (the put may then go peer to peer)."""
    return {"made_of": [g.index for g in chunk]} if getattr(inbox, "in_custody", False) else {}
