"""Fixed-size KV blocks with reference counts. Plain Python (no torch).

A block is referenced once by every running sequence whose block table holds it and
once by the prefix cache when the cache keeps it; it returns to the free pool when the
last reference goes. The pool never hands out more than `num_blocks` blocks, so the
KV capacity in tokens (`num_blocks * block_size`) cannot be exceeded.
"""
from __future__ import annotations

import heapq
from typing import Callable, Iterable


class OutOfBlocks(RuntimeError):
    """allocate() asked for more blocks than are free; callers check can_allocate first."""


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, on_grow: Callable[[int], None] | None = None):
        """`on_grow(high_water)`: called when a block above every one handed out before
        is handed out, before its caller can write it (the engine zeroes it: model_runner)."""
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_blocks: list[int] = list(range(num_blocks))
        """A min-heap: the lowest free block goes first, so the blocks in use stay packed low."""
        self.high_water = 0
        """1 + the highest block ever handed out."""
        self._on_grow = on_grow

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self.free_blocks)

    def allocate(self, num_blocks: int) -> list[int]:
        if num_blocks > len(self.free_blocks):
            raise OutOfBlocks(f"asked for {num_blocks} blocks, {len(self.free_blocks)} free")
        blocks = [heapq.heappop(self.free_blocks) for _ in range(num_blocks)]
        for block in blocks:
            assert self.ref_counts[block] == 0
            self.ref_counts[block] = 1
        if blocks and max(blocks) >= self.high_water:
            self.high_water = max(blocks) + 1
            if self._on_grow is not None:
                self._on_grow(self.high_water)
        return blocks

    def incref(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            assert self.ref_counts[block] > 0, f"incref of free block {block}"
            self.ref_counts[block] += 1

    def free(self, blocks: Iterable[int]) -> list[int]:
        """Drop one reference from each block; returns the blocks that became free."""
        freed = []
        for block in blocks:
            assert self.ref_counts[block] > 0, f"double free of block {block}"
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                heapq.heappush(self.free_blocks, block)
                freed.append(block)
        return freed

    def ref_count(self, block: int) -> int:
        return self.ref_counts[block]
