"""The P2P reshard plan: which piece of trainer state goes from which old rank to
which new rank when a trainer moves to a different layout.

Pure and plain Python (no torch). A layout is a list of shards; a shard is a
box of one logical tensor (`key`, e.g. "exp_avg" for a ZeRO-1 flat space, or
"exp_avg/model.layers.0.mlp.up_proj.weight" for a TP shard) held by one rank,
in global coordinates (offset and shape per dimension). The flat ranges of a
ZeRO-1 layout are the 1-D case; TP/PP shards are N-D boxes.

When the old shards of every key tile its global extent exactly once, and so do
the new ones, each element of state appears in exactly one transfer: the plan is
the set of non-empty intersections of old and new boxes of the same key.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from math import prod
from typing import Iterable, Sequence


@dataclass(frozen=True, slots=True)
class Shard:
    key: str
    rank: int
    offset: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True, slots=True)
class Transfer:
    key: str
    src: int
    dst: int
    offset: tuple[int, ...]
    """Global coordinates of the moved box."""
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return prod(self.shape)


class LayoutError(ValueError):
    """A layout does not tile its tensors exactly once."""


def flat_layout(ranges_by_key: dict[str, Sequence[tuple[int, int]]]) -> list[Shard]:
    """Shards of ZeRO-1 style flat ranges: `{key: [(start, end) per rank]}`."""
    return [Shard(key, rank, (start,), (end - start,))
            for key, ranges in ranges_by_key.items()
            for rank, (start, end) in enumerate(ranges) if end > start]


def plan_reshard(old: Iterable[Shard], new: Iterable[Shard], extents: dict[str, tuple[int, ...]]) -> list[Transfer]:
    """Transfers that rebuild `new` from `old`. `extents` gives each key's global
    shape; both layouts are checked to tile it exactly once (LayoutError if not)."""
    old_by_key = _by_key(old, extents, "old")
    new_by_key = _by_key(new, extents, "new")
    plan: list[Transfer] = []
    for key in sorted(extents):
        for target in new_by_key[key]:
            for source in old_by_key[key]:
                box = _intersect(source, target)
                if box is not None:
                    plan.append(Transfer(key, source.rank, target.rank, *box))
    return plan


def check_tiling(shards: Sequence[Shard], extent: tuple[int, ...], what: str = "layout") -> None:
    """Every element of the extent is covered by exactly one shard."""
    for shard in shards:
        if len(shard.offset) != len(extent) or len(shard.shape) != len(extent):
            raise LayoutError(f"{what}: shard {shard} has the wrong number of dimensions for {extent}")
        for o, s, e in zip(shard.offset, shard.shape, extent):
            if o < 0 or s < 0 or o + s > e:
                raise LayoutError(f"{what}: shard {shard} lies outside {extent}")
    covered = sum(s.numel for s in shards)
    if covered != prod(extent):
        raise LayoutError(f"{what}: shards of {shards[0].key if shards else '?'} cover {covered} "
                          f"elements of {prod(extent)}")
    ordered = sorted(shards, key=lambda s: s.offset)
    for i, a in enumerate(ordered):  # equal volume + pairwise disjoint = exact tiling
        for b in ordered[i + 1:]:
            if len(extent) == 1 and b.offset[0] >= a.offset[0] + a.shape[0]:
                break  # sorted 1-D ranges: nothing later can overlap `a`
            if _intersect(a, b) is not None:
                raise LayoutError(f"{what}: shards {a} and {b} overlap")


def _by_key(shards: Iterable[Shard], extents: dict[str, tuple[int, ...]], what: str) -> dict[str, list[Shard]]:
    grouped: dict[str, list[Shard]] = defaultdict(list)
    for shard in shards:
        if shard.key not in extents:
            raise LayoutError(f"{what}: unknown key {shard.key!r}")
        if shard.numel:
            grouped[shard.key].append(shard)
    for key, extent in extents.items():
        check_tiling(grouped[key], extent, f"{what} layout of {key!r}")
    return grouped


def _intersect(a: Shard, b: Shard) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    offset, shape = [], []
    for ao, as_, bo, bs in zip(a.offset, a.shape, b.offset, b.shape):
        lo, hi = max(ao, bo), min(ao + as_, bo + bs)
        if hi <= lo:
            return None
        offset.append(lo)
        shape.append(hi - lo)
    return tuple(offset), tuple(shape)
