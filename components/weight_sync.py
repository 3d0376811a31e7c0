"""Weight sync: the trainer's rank 0 broadcasts its full weights to every rollout
and inference rank over a runtime process group, bucket by bucket.

    header  int64 [version, num_buckets, fingerprint]     one broadcast
    bucket  float32 flat concatenation of its tensors      one broadcast each

Both sides derive the same buckets from the same model (the trainer's
`named_weights` rule: parameters in order, a new bucket when the next one would
pass `bucket_bytes`); the fingerprint (crc32 of every bucket's names and shapes)
proves they did. Receivers check the version is newer than what they hold: a
stale or repeated version is drained (so the collective completes) and refused.
Tensors travel as float32 and are cast back to each parameter's dtype on load.

On emulated devices (`dynarl sim`: the group is an EmulatedGroup) nothing is sent:
the receiving engines charge the transfer of their model's bytes themselves.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

from dynarl.components.trainer.base import bucket_by_bytes
from dynarl.transport.process_group import EmulatedGroup

Bucket = list[tuple[str, torch.Tensor]]


class StaleWeights(RuntimeError):
    """A weight update whose version is not newer than the receiver's."""


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """(name, shape) per bucket, by the trainer's named_weights rule (bucket_by_bytes)."""
    return [[(name, tuple(p.shape)) for name, p in bucket] for bucket in bucket_by_bytes(named, bucket_bytes)]


def fingerprint(plan: Sequence[Sequence[tuple[str, tuple[int, ...]]]]) -> int:
    text = "|".join(";".join(f"{n}:{list(s)}" for n, s in bucket) for bucket in plan)
    return zlib.crc32(text.encode())


def send(group: dist.ProcessGroup, buckets: Sequence[Bucket], version: int) -> int:
    """Rank 0 of `group`: broadcasts `buckets`. Returns the bytes sent."""
    plan = [[(n, tuple(t.shape)) for n, t in bucket] for bucket in buckets]
    header = torch.tensor([version, len(buckets), fingerprint(plan)], dtype=torch.int64)
    dist.broadcast(header, group_src=0, group=group)
    sent = 0
    for bucket in buckets:
        flat = torch.cat([t.detach().reshape(-1).to(torch.float32) for _, t in bucket])
        dist.broadcast(flat, group_src=0, group=group)
        sent += flat.numel() * 4
    return sent


def receive(group: dist.ProcessGroup, model: torch.nn.Module, bucket_bytes: int,
            current_version: int) -> tuple[list[tuple[str, torch.Tensor]], int]:
    """Any other rank: the (name, tensor) pairs and the version sent. Raises
    StaleWeights (after draining) when the version is not newer than `current_version`."""
    plan = plan_buckets(model.named_parameters(), bucket_bytes)
    header = torch.empty(3, dtype=torch.int64)
    dist.broadcast(header, group_src=0, group=group)
    version, num_buckets, theirs = (int(x) for x in header)
    if num_buckets != len(plan) or theirs != fingerprint(plan):
        raise ValueError(f"weight sync layout mismatch: the sender has {num_buckets} buckets "
                         f"(fingerprint {theirs}), this model {len(plan)} (fingerprint {fingerprint(plan)}); "
                         "trainer and receiver must run the same model with the same bucket_bytes")
    named: list[tuple[str, torch.Tensor]] = []
    for bucket in plan:
        flat = torch.empty(sum(_numel(s) for _, s in bucket), dtype=torch.float32)
        dist.broadcast(flat, group_src=0, group=group)
        offset = 0
        for name, shape in bucket:
            n = _numel(shape)
            named.append((name, flat[offset:offset + n].view(shape)))
            offset += n
    if version <= current_version:
        raise StaleWeights(f"weight version {version} is not newer than the version held ({current_version})")
    return named, version


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


async def send_async(group: Any, buckets: Sequence[Bucket], version: int) -> int:
    """`send` in a thread; on an emulated group nothing moves and the bytes the
    buckets describe ((name, num_bytes) pairs) are returned."""
    if isinstance(group, EmulatedGroup):
        return sum(int(n) for bucket in buckets for _, n in bucket)
    return await asyncio.to_thread(send, group, buckets, version)


async def receive_async(group: Any, model: torch.nn.Module | None, bucket_bytes: int, current_version: int,
                        version: int) -> list[tuple[str, torch.Tensor]] | None:
    """`receive` in a thread, checked against the `version` the workflow syncs; on an
    emulated group None (the engine charges the whole model's transfer)."""
    if isinstance(group, EmulatedGroup):
        if version <= current_version:
            raise StaleWeights(f"weight version {version} is not newer than the version held ({current_version})")
        return None
    named, sent = await asyncio.to_thread(receive, group, model, bucket_bytes, current_version)
    if sent != version:
        raise StaleWeights(f"the trainer sent weight version {sent}, the step expects {version}")
    return named
