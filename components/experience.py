"""What flows between the stages of an RL step, and how it becomes a TrainBatch.

A *group* is one prompt and its samples, a plain dict (msgpack-safe):

    {"index": 3,                      position of the group in its step
     "problem": "cu-17", "answer": "defg", "prompt_ids": [1, ...],
     "samples": [{"id": "cu-17/0", "seed": 123, "output_ids": [...], "logprobs": [...],
                  "finish": "stop", "version": 5,
                  "reward": 1.0,                       added by the reward stage
                  "old_logprobs": [...], "ref_logprobs": [...]},   added by inference
                 ...]}

A channel item is a *chunk*: a list of finished groups, put with weight = its
number of groups. The chunk size is the elastic-pipelining granularity: the next
stage starts on a chunk as soon as it is complete. END (None) tells one consumer
rank that its step's input is over.
"""
from __future__ import annotations

import zlib
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
    return [zlib.crc32(np.asarray(s["output_ids"], dtype=np.int64).tobytes())
            for g in sorted(groups, key=lambda g: g["index"]) for s in g["samples"]]


def samples(groups: Sequence[Group]) -> list[dict[str, Any]]:
    return [s for g in groups for s in g["samples"]]
