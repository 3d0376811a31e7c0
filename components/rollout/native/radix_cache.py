"""Prefix cache: a radix tree over token ids at block granularity. Plain Python.

Each node below the root holds one full KV block and is keyed by that block's
`block_size` token ids, so a path from the root spells a token prefix and lists the
blocks holding its KV. Only full blocks are cached: a block that is still being
written to never enters the tree.

The tree does not count references itself: the caller (the scheduler) holds one
BlockManager reference for every block the tree keeps, adds one for each block
`insert` newly keeps and drops one for each block `evict`/`reset` returns.
`evict` takes a predicate saying which blocks nobody else uses, so only leaves
whose memory would really come back are evicted, least recently used first.
"""
from __future__ import annotations

import heapq
from typing import Callable, Sequence


class Node:
    __slots__ = ("key", "block", "parent", "children", "last_access")

    def __init__(self, key: tuple[int, ...], block: int, parent: "Node | None", last_access: int):
        self.key = key
        self.block = block
        self.parent = parent
        self.children: dict[tuple[int, ...], Node] = {}
        self.last_access = last_access


class RadixCache:
    def __init__(self, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.root = Node((), -1, None, 0)
        self.num_blocks = 0
        self._clock = 0  # logical time: deterministic LRU order, no wall clock

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _chunks(self, token_ids: Sequence[int]):
        bs = self.block_size
        for start in range(0, len(token_ids) - bs + 1, bs):
            yield tuple(token_ids[start:start + bs])

    def match_prefix(self, token_ids: Sequence[int], touch: bool = True) -> list[int]:
        """Blocks holding the longest cached prefix of token_ids (a whole number of blocks;
        cached tokens = len(result) * block_size). touch marks them recently used."""
        now = self._tick() if touch else 0
        node, blocks = self.root, []
        for key in self._chunks(token_ids):
            node = node.children.get(key)
            if node is None:
                break
            if touch:
                node.last_access = now
            blocks.append(node.block)
        return blocks

    def insert(self, token_ids: Sequence[int], blocks: Sequence[int]) -> list[int]:
        """Cache the full blocks of token_ids, whose KV is in `blocks` (one per full block;
        extra entries are ignored). Returns the blocks the tree newly keeps; where the
        tree already had a block for the same tokens it keeps its own."""
        now = self._tick()
        node, kept = self.root, []
        for key, block in zip(self._chunks(token_ids), blocks):
            child = node.children.get(key)
            if child is None:
                child = Node(key, block, node, now)
                node.children[key] = child
                self.num_blocks += 1
                kept.append(block)
            child.last_access = now
            node = child
        return kept

    def evict(self, num_blocks: int, can_evict: Callable[[int], bool]) -> list[int]:
        """Remove up to num_blocks least recently used leaves whose block passes can_evict
        (a parent becomes a candidate once its last child goes). Returns their blocks."""
        heap = [(n.last_access, id(n), n) for n in self._leaves() if can_evict(n.block)]
        heapq.heapify(heap)
        evicted: list[int] = []
        while heap and len(evicted) < num_blocks:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            del parent.children[node.key]
            self.num_blocks -= 1
            evicted.append(node.block)
            if parent is not self.root and not parent.children and can_evict(parent.block):
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        return evicted

    def reset(self) -> list[int]:
        """Forget everything (e.g. after a weight update made the cached KV stale)."""
        blocks = [n.block for n in self._nodes()]
        self.root.children.clear()
        self.num_blocks = 0
        return blocks

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            yield node

    def _leaves(self):
        return (n for n in self._nodes() if not n.children)
