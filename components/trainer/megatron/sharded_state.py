"""A megatron model's ShardedLayout, read from its sharded_state_dict, and the torch
side of resharding: executing a plan's box copies on tensors.

megatron's dist_checkpointing describes every local parameter as ShardedTensors
with global offsets (the same metadata its own checkpoint resharding uses); a
factory (SwiGLU's linear_fc1) expands into two boxes, [gate_r] and [up_r]. Only the
metadata is used here: no checkpoint is written.
"""
from __future__ import annotations

from typing import Iterable, Mapping, MutableMapping

import msgpack
import torch
import torch.distributed as dist

from ..base import ParamSpec
from .layout import BoxCopy, Piece, ShardedLayout, box_slices


def rank_pieces(model: torch.nn.Module) -> tuple[list[Piece], dict[str, tuple[tuple[int, ...], str]]]:
    """This rank's boxes, and the global shape and dtype of every tensor they belong to."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories

    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    params = dict(model.named_parameters())
    pieces: list[Piece] = []
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    for name, value in sharded.items():
        param = params.get(name)
        if param is None:
            continue  # _extra_state objects and buffers: not weights
        for sh in value if isinstance(value, list) else [value]:
            if not isinstance(sh, ShardedTensor):
                continue
            if sh.flattened_range is not None:
                raise NotImplementedError(f"{sh.key}: flattened (optimizer-state) shards are not handled")
            replica = sh.replica_id if isinstance(sh.replica_id, int) else int(any(sh.replica_id))
            lead = sh.prepend_axis_num
            pieces.append(Piece(sh.key, tuple(sh.global_offset), (1,) * lead + tuple(sh.local_shape),
                                replica, name, _offset_in(sh.data, param)))
            tensors[sh.key] = (tuple(sh.global_shape), str(sh.dtype).removeprefix("torch."))
    return pieces, tensors


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


def gather_layout(pieces: list[Piece], tensors: Mapping[str, tuple[tuple[int, ...], str]],
                  tensor_parallel_size: int, pipeline_parallel_size: int,
                  group: dist.ProcessGroup | None = None) -> ShardedLayout:
    """Collective over `group` (default: the world): every rank's pieces, merged."""
    mine = msgpack.packb({"pieces": [p.to_wire() for p in pieces],
                          "tensors": [[k, list(s), d] for k, (s, d) in tensors.items()]})
    ranks = [msgpack.unpackb(b) for b in _all_gather_bytes(mine, group)]
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
                         pieces=tuple(tuple(Piece.from_wire(p) for p in r["pieces"]) for r in ranks))


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
                 destination: MutableMapping[str, torch.Tensor]) -> int:
    """Execute, on tensors at hand, the copies into `dst_rank` (reading the old ranks'
    parameters from `sources[src_rank][param]`). Returns the elements copied."""
    moved = 0
    for c in copies:
        if c.dst_rank != dst_rank:
            continue
        src = sources[c.src_rank][c.src_param][box_slices(c.src_box)]
        destination[c.dst_param][box_slices(c.dst_box)].copy_(src)
        moved += c.numel
    return moved
