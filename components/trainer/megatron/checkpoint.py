"""megatron trainer checkpoints: one safetensors file per rank (its TP slice of the
weights and its optimizer state, by local parameter name) plus `megatron.json`
(layout and step), written by rank 0. No pickle, unlike megatron's own
dist_checkpointing (torch.save inside).

Into the same layout (tensor parallel size, world size) each rank reads its own
file. Into another one (TP=2 -> TP=1, more data-parallel replicas, ...) each rank
assembles its parameters and their Adam moments from the old files with the same
box copies as a live reshard (layout.plan_copies over the ShardedLayout saved in
the metadata): a moment has its parameter's shape, so the same boxes apply; under
megatron's distributed optimizer the state has its own boxes (the layout's `state`),
each rank's file holding a flat range of each parameter.

`hf_weights` reads the policy back with HF names (for `dynarl export` and `dynarl
eval`): the files of data-parallel replica 0's TP ranks, joined and converted.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch
from safetensors.torch import load_file

from dynarl.components.trainer.native.checkpoint import (read_versioned_meta, save_shard, shard_file,
                                                         write_versioned_meta)
from dynarl.components.model.config import ModelConfig
from dynarl.components.trainer.megatron.convert import join_tp_shards, megatron_to_hf
from dynarl.components.trainer.megatron.layout import WEIGHTS, ShardedLayout, plan_copies
from dynarl.components.trainer.megatron.sharded_state import apply_copies

META_FILE = "megatron.json"
FORMAT_VERSION = 2
"""2: the layout may carry the optimizer state's own boxes (`state`, `flat`), the files
1-D state shards, main_param and adam_step. 1 (adamw only) is read too."""


def save(path: str, rank: int, world_size: int, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> None:
    """This rank's file; rank 0 also writes the metadata (after its own file)."""
    save_shard(path, rank, world_size, tensors)
    if rank == 0:
        write_versioned_meta(path, META_FILE, FORMAT_VERSION, meta)


def read_meta(path: str) -> dict[str, Any]:
    return read_versioned_meta(path, META_FILE, FORMAT_VERSION, " (not a megatron checkpoint)", readable=(1,))


def same_layout(meta: Mapping[str, Any], layout: Mapping[str, Any]) -> bool:
    return {k: meta.get(k) for k in layout} == dict(layout)


def read_own(path: str, rank: int, world_size: int) -> dict[str, torch.Tensor]:
    """This rank's file, written by the rank at the same place in the same layout."""
    return load_file(shard_file(path, rank, world_size))


def read_resharded(path: str, meta: Mapping[str, Any], new: ShardedLayout, rank: int,
                   shapes: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> dict[str, torch.Tensor]:
    """This rank's "<kind>/<local name>" tensors (kind: "param" and the optimizer's
    state; `shapes`: shape and dtype by key, as this rank holds them) cut from a checkpoint of another
    layout, "step" and the optimizer's counters (old rank 0's). Raises ValueError
    if an element would stay unset."""
    old = ShardedLayout.from_wire(meta["layout"])
    weights = [c for c in plan_copies(old, new) if c.dst_rank == rank]
    state = [c for c in plan_copies(old.state_layout(), new.state_layout()) if c.dst_rank == rank]
    files = {r: load_file(shard_file(path, r, old.world_size))
             for r in sorted({0} | {c.src_rank for c in weights + state})}
    out: dict[str, torch.Tensor] = {}
    for kind in sorted({key.split("/", 1)[0] for key in shapes}):
        prefix = kind + "/"
        sources = {r: {k[len(prefix):]: t for k, t in f.items() if k.startswith(prefix)} for r, f in files.items()}
        if not any(sources.values()):
            raise ValueError(f"checkpoint {path} holds no {kind!r} state (written by another optimizer?)")
        dest = {k[len(prefix):]: torch.empty(shape, dtype=dtype) for k, (shape, dtype) in shapes.items()
                if k.startswith(prefix)}
        moved = apply_copies(weights if kind == WEIGHTS else state, sources, rank, dest, old, new, kind)
        expected = sum(t.numel() for t in dest.values())
        if moved != expected:
            raise ValueError(f"checkpoint {path}: {kind} of rank {rank} got {moved} of {expected} elements")
        out.update({prefix + name: t for name, t in dest.items()})
    out.update({k: t for k, t in files[0].items() if "/" not in k})
    out["step"] = torch.tensor([int(meta["step"])], dtype=torch.int64)
    return out


def hf_weights(path: str, model: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every weight of the checkpoint's model. megatron
    orders ranks TP-innermost, so ranks 0..tp-1 are the TP group of data-parallel
    replica 0 (checked against the saved layout: every replica-0 box is theirs)."""
    meta = read_meta(path)
    layout = ShardedLayout.from_wire(meta["layout"])
    tp, world = layout.tensor_parallel_size, layout.world_size
    if layout.pipeline_parallel_size != 1:
        raise ValueError(f"checkpoint {path}: pipeline_parallel_size {layout.pipeline_parallel_size} is not read yet")
    stray = [(rank, p.key) for rank in range(tp, world) for p in layout.pieces[rank] if p.replica == 0]
    if stray:
        raise ValueError(f"checkpoint {path}: rank {stray[0][0]} holds the only copy of {stray[0][1]}; "
                         f"expected ranks 0..{tp - 1} to hold one whole replica")
    files = [load_file(shard_file(path, rank, world)) for rank in range(tp)]
    for key in files[0]:
        if key.startswith("param/"):
            name = key[len("param/"):]
            full = join_tp_shards(name, [f[key] for f in files])
            for hf_name, tensor in megatron_to_hf(name, full, model):
                yield hf_name, tensor.float()
