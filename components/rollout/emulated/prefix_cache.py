"""Prefix cache of the emulated engine: reference-counted KV blocks keyed by chained hashes.

A sequence's tokens are cut into full blocks of `block_size`; block i is keyed by
hash((key of block i-1, its tokens)), so equal keys mean equal prefixes (the
nano-vllm / vLLM scheme). Blocks referenced by running requests are pinned;
unreferenced ones stay cached and are evicted least-recently-released first
when the KV pool needs room. The engine counts a block's tokens once, however
many requests share it, which is what makes GRPO siblings cheap in KV.

Only counts and hashes live here; no KV data.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixCache:
    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()

    @property
    def num_tokens(self) -> int:
        """Tokens in all cached blocks, pinned or not."""
        return len(self._refs) * self.block_size

    @property
    def num_evictable_tokens(self) -> int:
        return len(self._evictable) * self.block_size

    def extend_hashes(self, hashes: Sequence[int], token_ids: Sequence[int], seed: int) -> list[int]:
        """Keys of every full block of `token_ids`, reusing `hashes` for the blocks they
        already cover (a finished turn extends its prompt's keys with its output's)."""
        bs = self.block_size
        out = list(hashes)
        parent = out[-1] if out else seed
        for start in range(len(out) * bs, len(token_ids) - bs + 1, bs):
            parent = hash((parent, *token_ids[start:start + bs]))
            out.append(parent)
        return out

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks present."""
        n = 0
        for h in hashes:
            if h not in self._refs:
                break
            n += 1
        return n

    def acquire(self, hashes: Sequence[int]) -> int:
        """Pin every block of `hashes`, creating the missing ones; returns how many were new."""
        new = 0
        for h in hashes:
            refs = self._refs.get(h)
            if refs is None:
                self._refs[h] = 1
                new += 1
            else:
                if refs == 0:
                    del self._evictable[h]
                self._refs[h] = refs + 1
        return new

    def release(self, hashes: Sequence[int]) -> None:
        # Reversed, so a sequence's last blocks become evictable before its first:
        # a shared prefix outlives the tails that hang off it.
        for h in reversed(hashes):
            refs = self._refs[h] - 1
            self._refs[h] = refs
            if refs == 0:
                self._evictable[h] = None

    def evict(self, num_tokens: int) -> int:
        """Drop least-recently-released unpinned blocks until `num_tokens` are freed or none
        are left; returns the tokens freed."""
        freed = 0
        while freed < num_tokens and self._evictable:
            h, _ = self._evictable.popitem(last=False)
            del self._refs[h]
            freed += self.block_size
        return freed

    def evict_all(self) -> int:
        return self.evict(self.num_evictable_tokens)
