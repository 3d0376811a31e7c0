"""What flows between the stages of an RL step, and how it becomes a TrainBatch.

A *group* is one prompt and its samples, a plain dict (msgpack-safe):

    {"index": 3,                      position of the group in its step
     "problem": "cu-17", "answer": "defg", "prompt_ids": [1, ...],
     "samples": [{"id": "cu-17/0", "seed": 123, "output_ids": [...], "logprobs": [...],
                  "finish": "stop", "version": 5,
                  "reward": 1.0, "advantage": 0.7,     added by the reward stage
                  "old_logprobs": [...], "ref_logprobs": [...]},   added by inference
                 ...]}

A channel item is a *chunk*: a list of finished groups, put with weight = its
number of groups. The chunk size is the elastic-pipelining granularity: the next
stage starts on a chunk as soon as it is complete. END (None) tells one consumer
rank that its step's input is over.

A simulated workload's samples also carry "max_new_tokens", the response length the
emulated engine makes; their ids and log-probs are LazyLists (rollout/emulated/tokens.py)
that only a reader builds, so their batches may carry lengths alone (`stream_batch`).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .trainer.base import TrainBatch

END = None
Group = dict[str, Any]


def train_batch(groups: Sequence[Group], with_ref: bool) -> TrainBatch:
    """The canonical batch: groups by index, samples in order, so the same groups
    give the same batch whatever order the stages finished them in."""
    ordered = sorted(groups, key=lambda g: g["index"])
    input_ids, prompt_lens, rewards, group_ids, old, ref = [], [], [], [], [], []
    for g in ordered:
        for s in g["samples"]:
            input_ids.append(list(g["prompt_ids"]) + list(s["output_ids"]))
            prompt_lens.append(len(g["prompt_ids"]))
            rewards.append(float(s["reward"]))
            group_ids.append(int(g["index"]))
            old.append(list(s["old_logprobs"]))
            if with_ref:
                ref.append(list(s["ref_logprobs"]))
    return TrainBatch(input_ids=input_ids, prompt_lens=prompt_lens, old_logprobs=old,
                      ref_logprobs=ref if with_ref else None, rewards=rewards, group_ids=group_ids)


def sample_ids(groups: Sequence[Group]) -> list[str]:
    return [s["id"] for g in sorted(groups, key=lambda g: g["index"]) for s in g["samples"]]


def token_digests(groups: Sequence[Group]) -> list[int]:
    """crc32 of each sample's generated tokens, in sample_ids order."""
    return [_digest(s["output_ids"]) for g in sorted(groups, key=lambda g: g["index"]) for s in g["samples"]]


def samples(groups: Sequence[Group]) -> list[dict[str, Any]]:
    return [s for g in groups for s in g["samples"]]


def group_advantages(rewards: Sequence[float], eps: float) -> list[float]:
    """GRPO advantages of one group: (r - mean) / (std + eps), std with Bessel's
    correction; a group of one, or one whose rewards are all equal, gets 0 (as
    trainer/native/losses.py grpo_advantages, which the trainer uses on whole batches)."""
    r = np.asarray(rewards, dtype=np.float32).astype(np.float64)  # a batch's rewards are float32
    if r.size < 2 or bool((r == r[0]).all()):
        return [0.0] * int(r.size)
    return ((r - r.mean()) / (r.std(ddof=1) + eps)).astype(np.float32).tolist()


def stream_batch(groups: Sequence[Group], with_ref: bool, lengths_only: bool = False) -> TrainBatch:
    """A streaming trainer's part of the step: its samples with the advantages the
    reward stage set (so a part may hold any samples, not only whole groups). With
    `lengths_only` (an engine that reads lengths alone) each sequence is a range."""
    samples = [(g, s) for g in groups for s in g["samples"]]
    prompt_lens = [len(g["prompt_ids"]) for g, _ in samples]
    advantages = [float(s["advantage"]) for _, s in samples]
    if lengths_only:
        return TrainBatch(input_ids=[range(p + len(s["output_ids"])) for p, (_, s) in zip(prompt_lens, samples)],
                          prompt_lens=prompt_lens, advantages=advantages)
    masks = [list(s["mask"]) for _, s in samples] if samples and "mask" in samples[0][1] else None
    return TrainBatch(input_ids=[list(g["prompt_ids"]) + list(s["output_ids"]) for g, s in samples],
                      prompt_lens=prompt_lens, response_mask=masks,
                      old_logprobs=[list(s["old_logprobs"]) for _, s in samples],
                      ref_logprobs=[list(s["ref_logprobs"]) for _, s in samples] if with_ref else None,
                      advantages=advantages)


@dataclass(slots=True)
class Trained:
    """What a streaming trainer rank trained in one step, per sample (msgpack-safe
    as to_wire()): the ledger's ids and digests, the step metrics' inputs."""
    ids: list[str] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def add(self, groups: Sequence[Group], digests: bool = True) -> None:
        """`digests`: crc32 of each sample's tokens; False (lengths-only samples): of its length."""
        for g in groups:
            for s in g["samples"]:
                out = s["output_ids"]
                self.ids.append(s["id"])
                self.digests.append(_digest(out) if digests else zlib.crc32(str(len(out)).encode()))
                self.rewards.append(float(s["reward"]))
                self.lengths.append(len(out))
                self.finishes.append(str(s["finish"]))
                self.versions.append(int(s["version"]))

    def to_wire(self) -> dict[str, list]:
        return {"ids": self.ids, "digests": self.digests, "rewards": self.rewards, "lengths": self.lengths,
                "finishes": self.finishes, "versions": self.versions}

    @classmethod
    def merge(cls, parts: Sequence[dict[str, list]]) -> "Trained":
        out = cls()
        for part in parts:
            for name in ("ids", "digests", "rewards", "lengths", "finishes", "versions"):
                getattr(out, name).extend(part[name])
        return out


def _digest(output_ids: Sequence[int]) -> int:
    return zlib.crc32(np.asarray(output_ids, dtype=np.int64).tobytes())
