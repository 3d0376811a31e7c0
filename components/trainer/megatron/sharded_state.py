"""A megatron model's ShardedLayout, read from its sharded_state_dict, and the torch
side of resharding: executing a plan's box copies on tensors.

megatron's dist_checkpointing describes every local parameter as ShardedTensors
with global offsets (the same metadata its own checkpoint resharding uses); a
factory (SwiGLU's linear_fc1) expands into two boxes, [gate_r] and [up_r]. Only the
metadata is used here: no checkpoint is written. Under megatron's distributed
optimizer a rank's optimizer state is a flat range of each parameter (layout.py
FlatRange): `box_view` reads and writes a box of such a 1-D shard in place.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping, MutableMapping

import msgpack
import torch
import torch.distributed as dist

from dynarl.components.trainer.base import ParamSpec
from dynarl.components.trainer.megatron.layout import (WEIGHTS, Box, BoxCopy, FlatRange, Piece, ShardedLayout,
                                                       box_slices, state_pieces)

RankPieces = tuple[list[Piece], list[Piece], list[FlatRange], dict[str, tuple[tuple[int, ...], str]]]


def rank_pieces(model: torch.nn.Module, ranges: Mapping[str, tuple[int, int]] | None = None) -> RankPieces:
    """This rank's weight boxes; its optimizer-state boxes and flat ranges when its
    state is a flat range of each parameter (`ranges`: distributed optimizer; else
    both empty); and the global shape and dtype of every tensor they belong to."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    params = dict(model.named_parameters())
    pieces: list[Piece] = []
    mp_replica: dict[int, int] = {}
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, value in sharded.items():
        param = params.get(name)
        if param is None:
            continue  # _extra_state objects and buffers: not weights
        for sh in value if isinstance(value, list) else [value]:
            if not isinstance(sh, ShardedTensor):
                continue
            if sh.flattened_range is not None:
                raise NotImplementedError(f"{sh.key}: weights in flattened shards (megatron's FSDP layouts) "
                                          "are not handled")
            replica = sh.replica_id if isinstance(sh.replica_id, int) else int(any(sh.replica_id))
            # megatron's replica_id is (.., tp, dp): leaving the last axis out gives the
            # replica among model-parallel ranks (the distributed optimizer's state has no DP copies)
            mp_replica[len(pieces)] = sh.replica_id if isinstance(sh.replica_id, int) else int(any(sh.replica_id[:-1]))
            lead = sh.prepend_axis_num
            pieces.append(Piece(sh.key, tuple(sh.global_offset), (1,) * lead + tuple(sh.local_shape),
                                replica, name, _offset_in(sh.data, param)))
            tensors[sh.key] = (tuple(sh.global_shape), str(sh.dtype).removeprefix("torch."))
    if ranges is None:
        return pieces, [], [], tensors
    flat = {name: FlatRange(name, *ranges.get(name, (0, 0)), tuple(p.shape)) for name, p in params.items()}
    return pieces, state_pieces(pieces, flat, mp_replica), list(flat.values()), tensors


def box_view(tensor: torch.Tensor, box: Box, flat: FlatRange | None) -> torch.Tensor:
    """tensor[box] of a local parameter's tensor; or, for a 1-D shard holding the flat
    range `flat` of it, the same elements as a (writable) strided view of the shard.
    The box must lie inside the range (the state pieces' boxes do)."""
    if flat is None:
        return tensor[box_slices(box)]
    if tensor.dim() != 1 or tensor.stride() != (1,) or tensor.numel() != flat.end - flat.start:
        raise ValueError(f"the state of {flat.param} is {tuple(tensor.shape)} (strides {tensor.stride()}), "
                         f"not a dense 1-D shard of its range [{flat.start}, {flat.end})")
    strides = [math.prod(flat.shape[d + 1:]) for d in range(len(flat.shape))]
    first = sum(lo * st for (lo, _), st in zip(box, strides)) - flat.start
    last = first + sum((hi - 1 - lo) * st for (lo, hi), st in zip(box, strides))
    if first < 0 or last >= flat.end - flat.start:
        raise ValueError(f"box {box} of {flat.param} is outside the held range [{flat.start}, {flat.end})")
    return tensor.as_strided(tuple(hi - lo for lo, hi in box), strides, tensor.storage_offset() + first)


def _offset_in(view: torch.Tensor, param: torch.Tensor) -> tuple[int, ...]:
    """Coordinates, in `param`, of the first element of `view` (a sub-box of it)."""
    if view.untyped_storage().data_ptr() != param.untyped_storage().data_ptr():
        raise ValueError("a ShardedTensor's data is not a view of its parameter")
    flat = view.storage_offset() - param.storage_offset()
    coords = []
    for stride in param.stride():
        coords.append(flat // stride)
        flat %= stride
    return tuple(coords)


def gather_layout(mine: RankPieces, tensor_parallel_size: int, pipeline_parallel_size: int,
                  group: dist.ProcessGroup | None = None) -> ShardedLayout:
    """Collective over `group` (default: the world): every rank's pieces (rank_pieces), merged."""
    pieces, state, flat, tensors = mine
    packed = msgpack.packb({"pieces": [p.to_wire() for p in pieces], "state": [p.to_wire() for p in state],
                            "flat": [f.to_wire() for f in flat],
                            "tensors": [[k, list(s), d] for k, (s, d) in tensors.items()]})
    ranks = [msgpack.unpackb(b) for b in _all_gather_bytes(packed, group)]
    sharded = any(r["flat"] for r in ranks)  # the optimizer state has boxes of its own
    specs: dict[str, tuple[tuple[int, ...], str]] = {}
    for r in ranks:  # first appearance in rank order: the same order on every rank
        for key, shape, dtype in r["tensors"]:
            specs.setdefault(key, (tuple(shape), dtype))
    params, offset = [], 0
    for key, (shape, dtype) in specs.items():
        params.append(ParamSpec(key, shape, dtype, offset))
        offset += params[-1].numel
    return ShardedLayout(params=tuple(params), total_numel=offset, world_size=len(ranks),
                         tensor_parallel_size=tensor_parallel_size, pipeline_parallel_size=pipeline_parallel_size,
                         pieces=tuple(tuple(Piece.from_wire(p) for p in r["pieces"]) for r in ranks),
                         state=tuple(tuple(Piece.from_wire(p) for p in r["state"]) for r in ranks) if sharded else (),
                         flat=tuple(tuple(FlatRange.from_wire(f) for f in r["flat"]) for r in ranks) if sharded else ())


def _all_gather_bytes(data: bytes, group: dist.ProcessGroup | None) -> list[bytes]:
    # nccl only moves device tensors
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    world = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = int(max(s.item() for s in sizes))
    buf = torch.zeros(longest, dtype=torch.uint8, device=device)
    buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    bufs = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(bufs, buf, group=group)
    return [bytes(b[:int(s.item())].cpu().numpy()) for b, s in zip(bufs, sizes)]


def apply_copies(copies: Iterable[BoxCopy], sources: Mapping[int, Mapping[str, torch.Tensor]], dst_rank: int,
                 destination: MutableMapping[str, torch.Tensor], old: ShardedLayout | None = None,
                 new: ShardedLayout | None = None, kind: str = WEIGHTS) -> int:
    """Execute, on tensors at hand, the copies into `dst_rank` (reading the old ranks'
    parameters from `sources[src_rank][param]`); with the layouts given, state `kind`
    is read and written where they put it (flat-range shards). Returns the elements
    copied."""
    moved = 0
    for c in copies:
        if c.dst_rank != dst_rank:
            continue
        src_range = old and old.flat_range(c.src_rank, kind, c.src_param)
        src = box_view(sources[c.src_rank][c.src_param], c.src_box, src_range)
        box_view(destination[c.dst_param], c.dst_box, new and new.flat_range(dst_rank, kind, c.dst_param)).copy_(src)
        moved += c.numel
    return moved
