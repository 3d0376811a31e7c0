"""Trainer checkpoints on disk. The native trainer's state is written with
torch.distributed.checkpoint (DCP): every rank writes its shards of the weights and of
AdamW's moments, and DCP's metadata lets any number of ranks read them back (a
checkpoint written at DP 2 loads at DP 1 or 3, each rank reading the rows it holds).
Beside them: `meta.json` (format version, config, step, the world size it was
written at) and each rank's RNG stream as safetensors. No pickle: DCP writes tensors
and its own metadata, everything else is JSON or safetensors.

The generic pieces (`save_shard`, the versioned JSON metadata) serve megatron's
checkpoints too (megatron/checkpoint.py).
"""
from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Iterator, Mapping

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from safetensors import safe_open
from safetensors.torch import save_file

from dynarl.core.files import atomic_open


FORMAT_VERSION = 2
"""1: the ZeRO-1 flat shards of releases before FSDP2 (not readable: the message says so)."""
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


def rng_file(path: str, rank: int) -> str:
    return os.path.join(path, f"rng-{rank:05d}.safetensors")


def save(path: str, state: dict[str, Any], group: Any, rank: int, rng: torch.Tensor,
         meta: Mapping[str, Any]) -> None:
    """Collective over `group`. DCP writes every rank's shards of `state` (state dicts
    of DTensors), each rank its RNG stream, rank 0 the metadata."""
    os.makedirs(path, exist_ok=True)
    with _plain_errors():
        dcp.save(state, checkpoint_id=path, process_group=group)
    tmp = rng_file(path, rank) + ".tmp"
    save_file({"rng_state": rng.contiguous()}, tmp)
    os.replace(tmp, rng_file(path, rank))
    if rank == 0:
        write_versioned_meta(path, META_FILE, FORMAT_VERSION, meta)


def load(path: str, state: dict[str, Any], group: Any) -> None:
    """Collective over `group`. Fills `state` (state dicts laid out for this world) in
    place from a checkpoint written at any world size."""
    with _plain_errors():
        dcp.load(state, checkpoint_id=path, process_group=group)


@contextlib.contextmanager
def _plain_errors() -> Iterator[None]:
    """DCP raises CheckpointException, a BaseException (no `except Exception` catches it:
    it would end the worker process); the first rank's own error is raised instead, so
    a full disk is an OSError ENOSPC as with any other file the run writes."""
    try:
        yield
    except CheckpointException as exc:
        cause = next((e for e, _ in exc.failures.values() if isinstance(e, Exception)), None)
        raise (cause or RuntimeError(str(exc))) from None


def load_meta(path: str) -> dict[str, Any]:
    """The checkpoint's metadata; one written by the ZeRO-1 trainer is refused by name."""
    meta = read_versioned_meta(path, META_FILE, FORMAT_VERSION, readable=(1,))
    if meta["format_version"] == 1:
        raise ValueError(f"checkpoint {path} holds ZeRO-1 flat shards (format 1) of an older dynarl; this "
                         "trainer (FSDP2) reads format 2: export it with that release, or start from its HF export")
    return meta


def read_rng(path: str, rank: int) -> torch.Tensor | None:
    """Rank `rank`'s RNG stream, or None when the checkpoint was written by fewer ranks."""
    file = rng_file(path, rank)
    if not os.path.exists(file):
        return None
    with safe_open(file, framework="pt") as f:
        return f.get_tensor("rng_state")


def read_weights(path: str, template: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The whole weights of a checkpoint, in one process without any group: `template`
    (a plain model's state dict) gives the names and shapes, filled in place."""
    load_meta(path)
    model = dict(template)
    dcp.load({"model": model}, checkpoint_id=path, no_dist=True)
    return model


def write_versioned_meta(path: str, name: str, version: int, meta: Mapping[str, Any]) -> None:
    """A checkpoint's JSON metadata with its format version, written atomically."""
    with atomic_open(os.path.join(path, name)) as f:
        json.dump({"format_version": version, **meta}, f, indent=1)


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
