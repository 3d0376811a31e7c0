"""Where an FSDP2 trainer's state lives: each parameter sharded on dim 0 over the
data-parallel ranks (`fully_shard`'s Shard(0)), in the box terms of the P2P reshard
planner (megatron/layout.py ShardedLayout), so a native trainer reshards DP n -> m
with the same plan and transfers as megatron's.

FSDP2 cuts dim 0 as torch.chunk does: chunks of ceil(rows / W) rows, the last ones
shorter or empty. Rank r holds rows [r * c, min((r + 1) * c, rows)) of the weights
and of each of AdamW's moments (the state has the weights' geometry). Plain Python.
"""
from __future__ import annotations

import math
from typing import Sequence

from dynarl.components.trainer.base import ParamSpec
from dynarl.components.trainer.megatron.layout import Piece, ShardedLayout


def dim0_rows(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """[start, stop) of dim 0 that `rank` holds (torch.chunk's split; may be empty)."""
    chunk = math.ceil(rows / world_size) if rows else 0
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def fsdp_layout(params: Sequence[tuple[str, tuple[int, ...], str]], world_size: int) -> ShardedLayout:
    """The layout of `params` ((name, global shape, dtype), in the model's order)
    sharded on dim 0 over `world_size` ranks."""
    specs, offset = [], 0
    for name, shape, dtype in params:
        specs.append(ParamSpec(name, tuple(shape), dtype, offset))
        offset += math.prod(shape)
    pieces: list[list[Piece]] = [[] for _ in range(world_size)]
    for spec in specs:
        if not spec.shape:
            raise ValueError(f"parameter {spec.name} has no dimension to shard")
        rest = spec.shape[1:]
        for rank in range(world_size):
            start, stop = dim0_rows(spec.shape[0], rank, world_size)
            if stop > start:
                zeros = (0,) * len(rest)
                pieces[rank].append(Piece(spec.name, (start, *zeros), (stop - start, *rest), 0, spec.name,
                                          (0, *zeros)))
    return ShardedLayout(params=tuple(specs), total_numel=offset, world_size=world_size, tensor_parallel_size=1,
                         pipeline_parallel_size=1, pieces=tuple(tuple(p) for p in pieces))
