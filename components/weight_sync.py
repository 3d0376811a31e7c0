"""Weight sync: the trainer's rank 0 broadcasts its full weights to every rollout
and inference rank over a runtime process group, bucket by bucket.

    header  int64 [version, num_buckets, fingerprint]     one broadcast
    bucket  flat concatenation of its tensors, in the      one broadcast each
            receivers' dtype (the model's: bf16 on a GPU)

Both sides plan the same buckets from the same model in the wire dtype (parameters
in order, a new bucket when the next one would pass `bucket_bytes`): a receiver
from its own model, the sender from the model's spec (`model_plan`), filling them
from the trainer's tensors as they come (megatron gathers each as it goes, so no
rank holds the whole model twice). The fingerprint (crc32 of every bucket's names
and shapes, and the dtype) proves they agree. Receivers check the version is newer than what
they hold: a stale or repeated version is drained (so the collective completes)
and refused.

Every tensor of the transfer is on the rank's own device (`device`: NCCL takes
nothing else): the header, the sender's cast buckets, the receive buffers. The
sender casts bucket k+1 while bucket k is on the wire (one broadcast in flight).
Members that share a device get the weights by a local hand-off, not a second
collective (the group is a transport/device_group.py SharedDeviceGroup).

On emulated devices (`dynarl sim`: the group is an EmulatedGroup) nothing is sent:
the receiving engines charge the transfer of their model's bytes themselves.
"""
from __future__ import annotations

import asyncio
import math
import zlib
from typing import Any, Awaitable, Callable, Iterable, Sequence

import torch
import torch.distributed as dist

from dynarl.components.stale_weights import StaleWeights
from dynarl.components.trainer.base import bucket_by_bytes
from dynarl.transport.process_group import EmulatedGroup

Bucket = list[tuple[str, torch.Tensor]]
Plan = list[list[tuple[str, tuple[int, ...]]]]
Load = Callable[[list[tuple[str, torch.Tensor]], int], None]
"""Takes one bucket's (name, tensor) pairs and the version the engine holds after it."""
LoadAsync = Callable[[list[tuple[str, torch.Tensor]] | None, int], Awaitable[None]]
"""Each bucket's (name, shape) pairs: what travels in one broadcast."""


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """(name, shape) per bucket, by the trainer's named_weights rule (bucket_by_bytes)."""
    return [[(name, tuple(p.shape)) for name, p in bucket] for bucket in bucket_by_bytes(named, bucket_bytes)]


def fingerprint(plan: Sequence[Sequence[tuple[str, tuple[int, ...]]]], dtype: torch.dtype) -> int:
    text = "|".join(";".join(f"{n}:{list(s)}" for n, s in bucket) for bucket in plan)
    return zlib.crc32(f"{dtype}|{text}".encode())


def send(group: dist.ProcessGroup, plan: Plan, tensors: Iterable[tuple[str, torch.Tensor]], version: int,
         dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> int:
    """Rank 0 of `group`: broadcasts `tensors` ((name, tensor) pairs, consumed as they
    come: a trainer may make each one as it goes, megatron gathering its TP slices) in
    the buckets of `plan` (the receivers'), in `dtype`, from `device`. At most two
    buckets are held at once. Returns the bytes sent."""
    header = torch.tensor([version, len(plan), fingerprint(plan, dtype)], dtype=torch.int64, device=device)
    dist.broadcast(header, group_src=0, group=group)
    sent, in_flight, pairs = 0, None, iter(tensors)
    for bucket in plan:
        parts = []
        for name, shape in bucket:
            got, t = next(pairs, (None, None))
            if got != name or tuple(t.shape) != tuple(shape):
                raise ValueError(f"weight sync: the plan has {name} {list(shape)} next, the trainer gave {got} "
                                 f"{None if t is None else list(t.shape)}; they must follow the same model order")
            parts.append(_flat_on(t, device, dtype))
        flat = torch.cat(parts)
        work = dist.broadcast(flat, group_src=0, group=group, async_op=True)
        if in_flight is not None:
            _settle(in_flight, device)
        in_flight = work
        sent += flat.numel() * flat.element_size()
    if in_flight is not None:
        _settle(in_flight, device)
    return sent


def _settle(work: Any, device: torch.device | str) -> None:
    """The broadcast done, its buffer free: on a GPU `wait` only orders the streams, so
    the host waits for the stream too (else it would cast every bucket ahead of the wire)."""
    work.wait()
    if torch.device(device).type == "cuda":
        torch.cuda.current_stream().synchronize()


def unbucket(buckets: Sequence[Bucket]) -> tuple[Plan, list[tuple[str, torch.Tensor]]]:
    """`send`'s plan and tensors from buckets held whole (their own plan)."""
    return [[(n, tuple(t.shape)) for n, t in bucket] for bucket in buckets], [p for bucket in buckets for p in bucket]


def model_plan(spec: Any, bucket_bytes: int, dtype: torch.dtype) -> Plan:
    """The buckets a receiver of `spec`'s model in `dtype` plans (engine_factory.weights_template's
    rule): the native architecture on the meta device, no memory."""
    from dynarl.components.model.spec import meta_model

    return plan_buckets(meta_model(spec, dtype).named_parameters(), bucket_bytes)


def receive(group: dist.ProcessGroup, model: torch.nn.Module, bucket_bytes: int, current_version: int,
            load: Load, device: torch.device | str = "cpu") -> int:
    """Any other rank: each bucket's (name, tensor) pairs, in the dtype of `model`'s
    parameters on `device`, go to `load(named, version)` as they arrive (the receiver
    holds one bucket, not a second copy of the model): with `current_version` until
    the last bucket, which carries the version sent (an engine cut off mid-way still
    says it holds the old weights, and is sent them again). Returns the version sent.
    A version not newer than `current_version` is drained (the collective completes),
    loads nothing and raises StaleWeights."""
    plan = plan_buckets(model.named_parameters(), bucket_bytes)
    dtype = wire_dtype(model)
    header = torch.empty(3, dtype=torch.int64, device=device)
    dist.broadcast(header, group_src=0, group=group)
    version, num_buckets, theirs = (int(x) for x in header.tolist())
    if num_buckets != len(plan) or theirs != fingerprint(plan, dtype):
        raise ValueError(f"weight sync layout mismatch: the sender has {num_buckets} buckets "
                         f"(fingerprint {theirs}), this model {len(plan)} in {dtype} (fingerprint "
                         f"{fingerprint(plan, dtype)}); trainer and receiver must run the same model in the same "
                         "dtype (model.dtype) with the same bucket_bytes")
    stale = version <= current_version
    for index, bucket in enumerate(plan):
        flat = torch.empty(sum(math.prod(s) for _, s in bucket), dtype=dtype, device=device)
        dist.broadcast(flat, group_src=0, group=group)
        if stale:
            continue
        named, offset = [], 0
        for name, shape in bucket:
            n = math.prod(shape)
            named.append((name, flat[offset:offset + n].view(shape)))
            offset += n
        load(named, version if index == len(plan) - 1 else current_version)
    if stale:
        raise StaleWeights(f"weight version {version} is not newer than the version held ({current_version})")
    return version


def _flat_on(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype) -> torch.Tensor:
    """`t` flattened, in `dtype`, on `device` (moved only if it is elsewhere: each rank sees its one GPU)."""
    t = t.detach().reshape(-1)
    if t.device.type != torch.device(device).type:
        t = t.to(device)
    return t.to(dtype)


def wire_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the weights travel in: the receiving model's (one dtype for all its parameters)."""
    dtypes = {p.dtype for p in model.parameters()}
    if len(dtypes) != 1:
        raise ValueError(f"a weight sync receiver holds parameters of several dtypes ({sorted(map(str, dtypes))}); "
                         "build it in one (model.dtype)")
    return dtypes.pop()


async def send_async(group: Any, plan: Plan, tensors: Iterable[tuple[str, Any]], version: int,
                     dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> int:
    """`send` in a thread (where `tensors` is consumed); on an emulated group nothing
    moves and the bytes `tensors` describe ((name, num_bytes) pairs) are returned."""
    if isinstance(group, EmulatedGroup):  # (sizes only: no thread, the virtual clock stays exact)
        return sum(int(n) for _, n in tensors)
    return await asyncio.to_thread(send, group, plan, tensors, version, dtype, device)


async def receive_async(group: Any, model: torch.nn.Module | None, bucket_bytes: int, current_version: int,
                        version: int, load: LoadAsync, device: torch.device | str = "cpu") -> None:
    """`receive` in a thread, checked against the `version` the workflow syncs, each
    bucket awaited into `load` on this loop as it arrives; on an emulated group
    `load(None, version)` once (the engine charges the whole model's transfer)."""
    if isinstance(group, EmulatedGroup):
        if version <= current_version:
            raise StaleWeights(f"weight version {version} is not newer than the version held ({current_version})")
        await load(None, version)
        return
    loop = asyncio.get_running_loop()

    def load_here(named: list[tuple[str, torch.Tensor]], at: int) -> None:
        asyncio.run_coroutine_threadsafe(load(named, at), loop).result()

    sent = await asyncio.to_thread(receive, group, model, bucket_bytes, current_version, load_here, device)
    if sent != version:
        raise StaleWeights(f"the trainer sent weight version {sent}, the step expects {version}")
