"""Plans for packed training: which samples share a micro-batch, which a DP rank trains.

Pure Python on sequence lengths (no torch), so the batch sharding in trainer/base.py
and the emulated engine can use them too.

- `plan_micro_batches`: samples grouped into micro-batches of at most `max_tokens`
  tokens (first-fit decreasing), so a packed micro-batch (micro_batch.py) does no
  padding and long and short responses share one.
- `packing_budget`: whether a step's micro-batches are padded or packed (auto: packed
  where padding would more than PAD_LIMIT x the tokens).
- `balance_parts`: a batch cut into one contiguous run of whole groups per DP rank,
  balanced by tokens rather than by group count: with long-tailed responses, equal
  group counts can leave one rank with most of the compute.
"""
from __future__ import annotations

from itertools import accumulate
from typing import Sequence


def plan_micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Sample indices grouped so each group's summed length is <= max_tokens (a sample
    longer than that alone in a group of its own). First-fit decreasing: the longest
    sample first, each into the first group with room; ties by index, so the plan is
    deterministic. Groups in the order they were opened, indices ascending within one."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    for i, n in enumerate(lengths):
        if n < 0:
            raise ValueError(f"lengths[{i}]={n} must be >= 0")
    groups: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        slot = next((g for g, free in enumerate(room) if free >= n), None)
        if slot is None:
            groups.append([i])
            room.append(max_tokens - n)  # negative for an oversized sample: nothing else fits
        else:
            groups[slot].append(i)
            room[slot] -= n
    return [sorted(g) for g in groups]


PAD_LIMIT = 1.5
"""Auto packing packs a step whose padded micro-batches would hold more than this many
times its tokens. Measured on the TRL jobs (docs/benchmarks.md "Against TRL"): the
short one (lengths within a few tokens: padding ~1.05x) trains padded in 0.42 s and
packed in 0.52 s; the long-tailed one (padding ~3.7x) in 2.06 s and 0.71 s."""


def packing_budget(lengths: Sequence[int], micro_batch_size: int, max_tokens: int | None) -> int:
    """The token budget of a step's packed micro-batches, or 0: padded ones of
    `micro_batch_size` samples in batch order. `max_tokens` > 0 packs (the user's budget),
    0 pads; None is auto: packed when the padded micro-batches (each as long as its
    longest sample) would hold more than PAD_LIMIT x the tokens, with a budget of the
    largest padded micro-batch (so no packed one holds more tokens, or more
    activations, than it)."""
    if max_tokens is not None:
        return max_tokens
    padded = largest = 0
    for start in range(0, len(lengths), micro_batch_size):
        part = lengths[start:start + micro_batch_size]
        padded += len(part) * max(part)
        largest = max(largest, len(part) * max(part))
    return largest if padded > PAD_LIMIT * sum(lengths) else 0


def balance_parts(lengths: Sequence[int], group_ids: Sequence[int] | None, world_size: int) -> list[list[int]]:
    """The sample indices of each of `world_size` DP ranks, in batch order: whole groups
    (samples sharing a group id; each sample its own group without ids) kept together,
    ranks taking contiguous runs of groups in order of first appearance, each run ending
    at the group boundary nearest to the rank's even share of the batch's tokens. With
    at least as many groups as ranks every rank gets one or more groups; with fewer,
    the first ranks get one group each and the rest none (as TrainBatch.shard does)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if group_ids is not None and len(group_ids) != len(lengths):
        raise ValueError(f"group_ids has {len(group_ids)} entries, lengths has {len(lengths)}")
    keys = list(group_ids) if group_ids is not None else list(range(len(lengths)))
    order = list(dict.fromkeys(keys))  # groups by first appearance
    tokens = dict.fromkeys(order, 0)
    for key, n in zip(keys, lengths):
        tokens[key] += n
    cuts = _cuts([tokens[k] for k in order], world_size)
    rank_of = {key: r for r in range(world_size) for key in order[cuts[r]:cuts[r + 1]]}
    parts: list[list[int]] = [[] for _ in range(world_size)]
    for i, key in enumerate(keys):
        parts[rank_of[key]].append(i)
    return parts


def _cuts(weights: list[int], world_size: int) -> list[int]:
    """Boundaries 0 = c_0 <= c_1 <= ... <= c_W = len(weights) of W contiguous runs: c_r
    is the boundary whose prefix sum is nearest r / W of the total (the earlier on a
    tie), kept so that every later run can still have one weight."""
    count = len(weights)
    if count <= world_size:
        return [min(r, count) for r in range(world_size + 1)]
    prefix = [0, *accumulate(weights)]
    cuts = [0]
    for r in range(1, world_size):
        target = prefix[-1] * r / world_size
        lo, hi = cuts[-1] + 1, count - (world_size - r)
        cuts.append(min(range(lo, hi + 1), key=lambda c: (abs(prefix[c] - target), c)))
    cuts.append(count)
    return cuts
