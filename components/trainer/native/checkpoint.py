"""Trainer checkpoints on disk: one safetensors file per data-parallel rank plus
`meta.json` (format version, StateLayout, config, step). No pickle: tensors are
safetensors, everything else is JSON.

A reader with another world size assembles its own flat range from whichever
old shard files overlap it (`read_flat_range`), reading only those slices.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dynarl.core.files import atomic_open

from dynarl.components.trainer.base import StateLayout
from dynarl.components.trainer.native.sharding import overlaps

FORMAT_VERSION = 1
META_FILE = "meta.json"


def shard_file(path: str, rank: int, world_size: int) -> str:
    return os.path.join(path, f"shard-{rank:05d}-of-{world_size:05d}.safetensors")


def save_shard(path: str, rank: int, world_size: int, tensors: Mapping[str, torch.Tensor]) -> None:
    """Write this rank's tensors (moved to CPU) atomically: a reader never sees half a file."""
    os.makedirs(path, exist_ok=True)
    final = shard_file(path, rank, world_size)
    tmp = final + ".tmp"
    seen: set[int] = set()
    save_file({k: _alone(v, seen) for k, v in tensors.items()}, tmp)
    os.replace(tmp, final)


def _alone(t: torch.Tensor, seen: set[int]) -> torch.Tensor:
    """t on the CPU in a storage of its own: safetensors refuses tensors that share one
    (an optimizer's main weights can be views of one flat buffer, or the weights)."""
    t = t.detach().to("cpu").contiguous()
    storage = t.untyped_storage()
    if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
        return t.clone()
    seen.add(storage.data_ptr())
    return t


def save_meta(path: str, layout: StateLayout, config: Mapping[str, Any], step: int) -> None:
    os.makedirs(path, exist_ok=True)
    write_versioned_meta(path, META_FILE, FORMAT_VERSION,
                         {"layout": layout.to_wire(), "config": dict(config), "step": step})


def write_versioned_meta(path: str, name: str, version: int, meta: Mapping[str, Any]) -> None:
    """A checkpoint's JSON metadata with its format version, written atomically."""
    with atomic_open(os.path.join(path, name)) as f:
        json.dump({"format_version": version, **meta}, f, indent=1)


def load_meta(path: str) -> tuple[StateLayout, dict[str, Any]]:
    """(layout the checkpoint was written with, the whole metadata dict)."""
    meta = read_versioned_meta(path, META_FILE, FORMAT_VERSION)
    return StateLayout.from_wire(meta["layout"]), meta


def read_versioned_meta(path: str, name: str, version: int, kind: str = "",
                        readable: tuple[int, ...] = ()) -> dict[str, Any]:
    """A checkpoint's JSON metadata file, checked for its format version (`version`,
    or one of the older `readable` ones)."""
    file = os.path.join(path, name)
    if not os.path.exists(file):
        raise FileNotFoundError(f"no {name} in checkpoint directory {path}{kind}")
    with open(file) as f:
        meta = json.load(f)
    if meta.get("format_version") != version and meta.get("format_version") not in readable:
        raise ValueError(f"checkpoint {path}: format_version {meta.get('format_version')}, expected {version}")
    return meta


def read_flat_range(path: str, layout: StateLayout, state: str, start: int, end: int) -> torch.Tensor:
    """Elements [start, end) of `state`'s flat space, gathered from the shard files
    of a checkpoint written with `layout` (any world size)."""
    pieces = []
    for rank, lo, hi in overlaps(layout.shards[state], start, end):
        owner_start = layout.shards[state][rank][0]
        with safe_open(shard_file(path, rank, layout.world_size), framework="pt") as f:
            pieces.append(f.get_slice(state)[lo - owner_start:hi - owner_start])
    if not pieces:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat(pieces)


def read_tensor(path: str, rank: int, world_size: int, name: str) -> torch.Tensor | None:
    """A whole named tensor from one rank's file, or None when it is not there."""
    file = shard_file(path, rank, world_size)
    if not os.path.exists(file):
        return None
    with safe_open(file, framework="pt") as f:
        return f.get_tensor(name) if name in f.keys() else None
