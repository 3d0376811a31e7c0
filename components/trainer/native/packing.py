"""Plans for packed training: which samples share a micro-batch, which a DP rank trains.

Pure Python on sequence lengths (no torch), so the batch sharding in trainer/base.py
and the emulated engine can use them too.

- `plan_micro_batches`: samples grouped into micro-batches of at most `max_tokens`
  tokens (first-fit decreasing), so a packed micro-batch (micro_batch.py) does no
  padding and long and short responses share one.
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
