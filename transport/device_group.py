"""A process group whose members may share a device.

NCCL refuses a communicator with two members on one GPU, yet dynarl puts ranks of
several components on one device on purpose (a colocated or time-shared trainer,
rollout and inference; the old and new ranks of a create-before-destroy reshard).
So collectives run only between distinct devices, and what a member needs from
another member of its own device is handed over locally:

    broadcast   the devices' leaders (the first member on each device) broadcast
                among themselves over the real backend; each leader then hands the
                tensor to the other members of its device (a root that is not its
                device's leader hands it to its leader first)
    send, recv  between two devices: the real backend over every member (NCCL makes a
                communicator of the two ranks of a pair); within one: a local hand-off
    barrier     through the group's store
    the rest    refused (`SharedDevice`): a reduction over members of one device
                has no meaning NCCL would accept

A local hand-off goes through the group's store (sealed under the job secret:
sealed_store.py). On a CPU device the key holds the tensor's bytes. On a GPU it
holds a CUDA IPC handle of the sender's tensor (what
`torch.multiprocessing` shares, as plain fields, never a pickle); the receiver copies
from it and acknowledges, and only then does the sender's call return, so the sender
may reuse the tensor. The CUDA path follows torch's IPC API and has not run on a GPU.

`plan_broadcast` is the pure decision, tested with tables.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import msgpack
import torch
import torch.distributed as dist

from dynarl.transport.c10d_registry import unregister


STORE_PIECE_BYTES = 4 << 20
"""A CPU hand-off goes through the store in pieces of at most this many bytes: the
TCPStore server refuses a value over 8 MiB ("Invalid payload size"), and sealing adds
a little to each."""


class SharedDevice(RuntimeError):
    """A collective that would put two members of one device in one communicator."""


class WrongDevice(RuntimeError):
    """A tensor in a transfer that is not on the rank's device (NCCL refuses it)."""


@dataclass(frozen=True, slots=True)
class BroadcastPlan:
    leaders: tuple[int, ...]
    """The group ranks that take part in the backend's broadcast, one per device."""
    root_leader: int
    """The leader the broadcast starts from (the root's device's leader)."""
    followers: dict[int, tuple[int, ...]]
    """Leader -> the other ranks of its device that get the tensor from it (not the root)."""


def leaders_of(devices: Sequence[int | None]) -> list[int]:
    """The first rank on each device, in rank order; a rank with no device (None) leads itself."""
    seen: set[int] = set()
    out = []
    for rank, device in enumerate(devices):
        if device is None or device not in seen:
            out.append(rank)
            if device is not None:
                seen.add(device)
    return out


def has_shared_device(devices: Sequence[int | None]) -> bool:
    return len(leaders_of(devices)) < len(devices)


def plan_broadcast(devices: Sequence[int | None], root: int) -> BroadcastPlan:
    leaders = leaders_of(devices)
    leader_of = {r: (r if devices[r] is None else next(l for l in leaders if devices[l] == devices[r]))
                 for r in range(len(devices))}
    followers = {l: tuple(r for r in range(len(devices)) if leader_of[r] == l and r != l and r != root)
                 for l in leaders}
    return BroadcastPlan(tuple(leaders), leader_of[root], {l: f for l, f in followers.items() if f})


class _Done(dist._Work):
    """The Work of a transfer already complete when it was posted."""

    def __init__(self, tensors: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self._tensors = tensors or []

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._tensors


class _Later(dist._Work):
    """A transfer within one device that completes in wait(): a receive, or a send's receipt."""

    def __init__(self, run: Any) -> None:
        super().__init__()
        self._run, self._done = run, False

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        if not self._done:
            self._run()
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


class SharedDeviceGroup(dist.ProcessGroup):
    """The group's collectives as above. `full`: the backend over every member (its
    point-to-point transfers only); `leaders_group`: the backend over the devices'
    leaders (None on a rank that leads no device); `store`: the group's prefixed
    store; `devices`: each group rank's device (global id, None: none)."""

    def __init__(self, store: Any, rank: int, devices: Sequence[int | None], full: Any, leaders_group: Any,
                 device: torch.device, timeout: datetime.timedelta) -> None:
        super().__init__(rank, len(devices))  # type: ignore[call-arg]  # torch's stub lacks this form
        self.store = dist.PrefixStore("handoff/", store)  # apart from the backends' own keys
        self.devices, self.device, self.timeout = list(devices), device, timeout
        self.leaders = leaders_of(devices)
        self.full, self.inner = full, leaders_group
        self._seq = 0
        self._pair_seq: dict[tuple[int, int, int], int] = {}

    def getBackendName(self) -> str:
        return "shared-device"

    def name(self) -> str:
        return "shared-device"

    # --- collectives ---------------------------------------------------------------
    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist._Work:  # type: ignore[override]  # c10d calls only this form
        (tensor,) = tensors
        self._check(tensor)
        seq = self._next()
        me, plan = self.rank(), plan_broadcast(self.devices, opts.rootRank)
        root = opts.rootRank
        if root != plan.root_leader:  # the root hands the tensor to its device's leader first
            if me == root:
                self._hand(tensor, plan.root_leader, f"bc/{seq}/up")()
            elif me == plan.root_leader:
                self._take(tensor, root, f"bc/{seq}/up")
        if me in plan.leaders and len(plan.leaders) > 1:
            inner_opts = dist.BroadcastOptions()
            inner_opts.rootRank = plan.leaders.index(plan.root_leader)
            self.inner.broadcast([tensor], inner_opts).wait()
        receipts = [self._hand(tensor, follower, f"bc/{seq}/{follower}") for follower in plan.followers.get(me, ())]
        for leader, followers in plan.followers.items():
            if me in followers:
                self._take(tensor, leader, f"bc/{seq}/{me}")
        for receipt in receipts:
            receipt()
        return _Done(tensors)

    def barrier(self, opts: Any = None) -> dist._Work:
        seq = self._next()
        if self.store.add(f"barrier/{seq}", 1) == self.size():
            self.store.delete_key(f"barrier/{seq}")
            self.store.set(f"barrier/{seq}/done", "1")
        self.store.wait([f"barrier/{seq}/done"], self.timeout)
        return _Done()

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist._Work:
        (tensor,) = tensors
        self._check(tensor)
        if not self._same_device(dst):
            return self.full.send(tensors, dst, tag)
        return _Later(self._hand(tensor, dst, self._pair_key(self.rank(), dst, tag)))

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist._Work:
        (tensor,) = tensors
        self._check(tensor)
        if not self._same_device(src):
            return self.full.recv(tensors, src, tag)
        key = self._pair_key(src, self.rank(), tag)
        return _Later(lambda: self._take(tensor, src, key))

    def _refuse(self, what: str) -> dist._Work:
        raise SharedDevice(f"{what} on a group whose ranks {self._sharing()} share devices: NCCL refuses two "
                           "members of one communicator on one GPU. Between two devices only their first "
                           "ranks transfer, within one device a local hand-off (transport/device_group.py)")

    def allreduce(self, *args: Any) -> dist._Work:
        return self._refuse("all_reduce")

    def allgather(self, *args: Any) -> dist._Work:
        return self._refuse("all_gather")

    def _allgather_base(self, *args: Any) -> dist._Work:
        return self._refuse("all_gather_into_tensor")

    def reduce_scatter(self, *args: Any) -> dist._Work:
        return self._refuse("reduce_scatter")

    def _reduce_scatter_base(self, *args: Any) -> dist._Work:
        return self._refuse("reduce_scatter_tensor")

    def reduce(self, *args: Any) -> dist._Work:
        return self._refuse("reduce")

    def gather(self, *args: Any) -> dist._Work:
        return self._refuse("gather")

    def scatter(self, *args: Any) -> dist._Work:
        return self._refuse("scatter")

    def alltoall_base(self, *args: Any) -> dist._Work:
        return self._refuse("all_to_all")

    def shutdown(self) -> None:
        for group in (self.inner, self.full):
            if group is not None:
                unregister(group)
                try:
                    group.shutdown()
                except Exception:  # noqa: BLE001 - a peer may be gone; the other backend still goes
                    pass

    # --- the local hand-off ----------------------------------------------------------
    def _hand(self, tensor: torch.Tensor, to: int, key: str) -> Callable[[], None]:
        """Posts `tensor` for rank `to` under `key` (it never blocks); returns the wait
        for its receipt (on a GPU the receiver copies from the sender's memory: until
        then the tensor must not change)."""
        if tensor.device.type != "cuda":
            data = tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            pieces = range(0, len(data), STORE_PIECE_BYTES)
            for i, start in enumerate(pieces):
                self.store.set(f"{key}/{i}", data[start:start + STORE_PIECE_BYTES])  # type: ignore[arg-type]  # c10d takes bytes
            self.store.set(key, str(len(pieces)))  # last: the receiver waits for it
            return lambda: None
        self.store.set(key, msgpack.packb([os.getpid(), list(tensor.shape), str(tensor.dtype), cuda_handle(tensor)]))

        def receipt() -> None:
            self.store.wait([f"{key}/ack"], self.timeout)
            self.store.delete_key(f"{key}/ack")
        return receipt

    def _take(self, tensor: torch.Tensor, frm: int, key: str) -> None:
        self.store.wait([key], self.timeout)
        data = self.store.get(key)
        self.store.delete_key(key)
        if tensor.device.type == "cuda":
            pid, shape, dtype, fields = msgpack.unpackb(data)
            if pid == os.getpid():
                raise SharedDevice("two ranks of one process on one GPU (launcher inproc): a CUDA IPC handle "
                                   "does not open in the process that made it; use the local launcher")
            if shape != list(tensor.shape) or dtype != str(tensor.dtype):
                raise ValueError(f"a local hand-off from rank {frm} brought {dtype} {shape}, this tensor is "
                                 f"{tensor.dtype} {list(tensor.shape)}")
            with torch.no_grad():
                tensor.copy_(from_cuda_handle(fields))
            torch.cuda.current_stream().synchronize()
            self.store.set(f"{key}/ack", "1")
            return
        parts = [f"{key}/{i}" for i in range(int(data))]
        data = b"".join(self.store.get(part) for part in parts)
        for part in parts:
            self.store.delete_key(part)
        expected = tensor.numel() * tensor.element_size()
        if len(data) != expected:
            raise ValueError(f"a local hand-off from rank {frm} brought {len(data)} bytes, this tensor holds {expected}")
        with torch.no_grad():
            tensor.copy_(torch.frombuffer(bytearray(data), dtype=tensor.dtype).view(tensor.shape))

    # --- helpers ---------------------------------------------------------------------
    def _check(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != self.device.type:
            raise WrongDevice(f"a {tensor.device} tensor in a transfer of a group on {self.device}: "
                              "NCCL takes only tensors on the rank's own device")

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _pair_key(self, src: int, dst: int, tag: int) -> str:
        n = self._pair_seq.get((src, dst, tag), 0)
        self._pair_seq[(src, dst, tag)] = n + 1
        return f"p2p/{src}/{dst}/{tag}/{n}"

    def _same_device(self, peer: int) -> bool:
        mine = self.devices[self.rank()]
        return mine is not None and mine == self.devices[peer]

    def _sharing(self) -> list[int]:
        return [r for r in range(self.size()) if self.devices[r] is not None
                and self.devices.count(self.devices[r]) > 1]


def post_all(ops: Sequence[dist.P2POp]) -> list[dist._Work]:
    """Every point-to-point transfer of `ops` (one group's, this rank's side) posted at
    once, in an order every rank agrees on, so none can wait on another in a cycle:
    by peer pair (lower group rank first), within a pair the lower rank's sends before
    the higher rank's, then by tag. NCCL makes a communicator of the two ranks of a
    pair on its first transfer and runs a pair's transfers in the order posted; within
    one device they are local hand-offs (SharedDeviceGroup). Not batch_isend_irecv:
    its NCCL group call would set up one communicator over every member (refused
    where two share a GPU) and needs every rank in the first batch. Wait on the
    Works in the order returned (a send's receipt may wait on the peer's receive)."""
    if not ops:
        return []
    group = ops[0].group
    me = group.rank()

    def order(op: dist.P2POp) -> tuple[int, int, int, int]:
        peer, send = op.group_peer, op.op is dist.isend
        first = me if send else peer  # who sends in this direction
        return (min(me, peer), max(me, peer), first != min(me, peer), op.tag)

    works = []
    for op in sorted(ops, key=order):
        peer = {"group_dst" if op.op is dist.isend else "group_src": op.group_peer}
        works.append((op.op is dist.isend, op.op(op.tensor, group=group, tag=op.tag, **peer)))
    return [w for send, w in works if not send] + [w for send, w in works if send]


def cuda_handle(tensor: torch.Tensor) -> list[Any]:
    """A CUDA tensor's IPC handle as plain fields (rebuild_cuda_tensor's arguments, the
    classes and dtype by name). Unverified on a GPU."""
    from torch.multiprocessing.reductions import reduce_tensor

    _, args = reduce_tensor(tensor.detach())
    (_, size, stride, offset, _, dtype, device, handle, storage_bytes, storage_offset, _, ref_handle,
     ref_offset, event, event_sync) = args
    return [list(size), list(stride), offset, str(dtype).removeprefix("torch."), device, handle,
            storage_bytes, storage_offset, ref_handle, ref_offset, event, event_sync]


def from_cuda_handle(fields: list[Any]) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    (size, stride, offset, dtype, device, handle, storage_bytes, storage_offset, ref_handle, ref_offset,
     event, event_sync) = fields
    return rebuild_cuda_tensor(torch.Tensor, torch.Size(size), tuple(stride), offset, torch.storage.TypedStorage,
                               getattr(torch, dtype), device, handle, storage_bytes, storage_offset, False,
                               ref_handle, ref_offset, event, event_sync)
