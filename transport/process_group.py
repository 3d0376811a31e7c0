"""torch.distributed process groups created and destroyed while the job runs.

Each group gets its own TCPStore (hosted by its rank 0) and key prefix, sealed
with a key drawn from the job secret (sealed_store.py: an outsider who connects to
the store reads and forges nothing), and is built directly rather than through
init_process_group (which allows one default group per process): a process can
then belong to many groups at once and leave and rejoin with a different member
set, which trainer resharding needs.

The backend is wrapped in a ProcessGroup and its rank map registered with c10d,
as `new_group` does internally, so the standard calls work with group-relative
ranks: `dist.send(t, group_dst=1, group=pg)`, `dist.broadcast(t, group_src=0,
group=pg)`, `all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`,
`barrier` (checked on torch 2.13). There is no default group, so pass `group=`
and `group_src`/`group_dst`, never global ranks.

These calls block (rendezvous), so callers run them in a thread.

On emulated devices (`dynarl sim`) a group is an `EmulatedGroup`: its name, rank
and size, with no store and no collectives; the emulated engines that use it
spend the cost model's time for what a real group would carry.
"""
from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass
from typing import Any, Sequence

from dynarl.transport.c10d_registry import register, unregister


@dataclass(slots=True)
class GroupMembership:
    name: str
    rank: int
    size: int
    group: Any
    store: Any
    """The group's SealedStore over its TCPStore (None: emulated); leave_group closes it."""


@dataclass(frozen=True, slots=True)
class EmulatedGroup:
    """A process group of emulated devices: membership only."""
    name: str
    _rank: int
    _size: int

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def host_store(host: str) -> Any:
    """Starts a TCPStore server on a free port of `host` only; the caller reads `.port`.
    TCPStore's own server listens on every interface whatever host it is given, so
    the listening socket is made here (loopback in a single-host job, the node's
    address across hosts) and handed over (`master_listen_fd`: the store owns it)."""
    import torch.distributed as dist
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.create_server((host, 0), family=family, backlog=4096)
    port = listener.getsockname()[1]
    try:
        store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60), master_listen_fd=listener.fileno())
    except BaseException:
        listener.close()
        raise
    listener.detach()  # the store owns the socket now
    return store


def join_group(name: str, prefix: str, rank: int, size: int, host: str, port: int,
               backend: str, timeout_s: float, store: Any = None, own_host: str | None = None,
               devices: Sequence[int | None] | None = None, *, secret: bytes) -> GroupMembership:
    """Joins group `name` as `rank` of `size`, rendezvous at the store on host:port
    under the key `prefix`, fresh for each build of the group (a rebuilt group's keys
    stay apart from the old one's). `secret`: the job secret; the store takes any
    client that reaches its port and lists its keys to it, so every name and value
    in it is sealed under build_key(secret, prefix) (sealed_store.py).
    `own_host`: this rank's node address as its peers reach it. Gloo's pairs listen on
    it and advertise it; left to itself gloo takes the address the machine's hostname
    resolves to, which is loopback on many hosts (Debian's /etc/hosts maps the
    hostname to 127.0.1.1), and the peers on other hosts are refused.
    `devices`: each member's device (global id; None: none). Where two members share
    one, the group is a SharedDeviceGroup (device_group.py): collectives only between
    distinct devices, local hand-offs within one, as NCCL requires."""
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"process group {name!r}: timeout_s must be > 0 (got {timeout_s!r}); a collective "
                         "with no timeout hangs the job instead of failing it")
    if backend == "emulated":
        return GroupMembership(name, rank, size, EmulatedGroup(name, rank, size), None)
    import torch.distributed as dist

    from dynarl.transport.device_group import SharedDeviceGroup, has_shared_device, leaders_of
    from dynarl.transport.sealed_store import SealedStore, build_key
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    sealed = SealedStore(store, build_key(secret, prefix))  # open until leave_group (sealed_store.py)
    prefixed = dist.PrefixStore(prefix, sealed)
    if devices is not None and has_shared_device(devices):
        leaders = leaders_of(devices)
        full, device = _group(prefixed, rank, size, backend, timeout, own_host)
        inner = None
        if rank in leaders and len(leaders) > 1:
            try:
                inner, _ = _group(dist.PrefixStore("leaders", prefixed), leaders.index(rank), len(leaders),
                                  backend, timeout, own_host)
            except BaseException:
                unregister(full)
                raise
        group = SharedDeviceGroup(prefixed, rank, devices, full, inner, device, timeout)
        register(group, size, backend, prefixed)
    else:
        group, _ = _group(prefixed, rank, size, backend, timeout, own_host)
    return GroupMembership(name, rank, size, group, sealed)


def _group(store: Any, rank: int, size: int, backend: str, timeout: datetime.timedelta,
           own_host: str | None) -> tuple[Any, Any]:
    """A ProcessGroup of one backend, registered with c10d (so the standard calls take
    it with group-relative ranks), and the device its tensors are on."""
    import torch.distributed as dist
    impl, backend_type, device = _backend(store, rank, size, backend, timeout, own_host)
    group = dist.ProcessGroup(store, rank, size)
    group._set_default_backend(backend_type)
    group._register_backend(device, backend_type, impl)
    register(group, size, backend, store)
    return group, device


def _backend(store: Any, rank: int, size: int, backend: str, timeout: datetime.timedelta,
             own_host: str | None) -> tuple[Any, Any, Any]:
    """The backend (gloo, nccl) of one group: (impl, its BackendType, the device its tensors are on).
    Both get the group's timeout (NCCL's own default is 10 minutes, after which its
    watchdog kills the process instead of letting the caller roll back)."""
    import torch
    import torch.distributed as dist
    kind = dist.ProcessGroup.BackendType
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
        options._timeout = timeout
        options._devices = [_gloo_device(own_host)]
        options._threads = 2  # what the (store, rank, size, timeout) constructor uses for one device
        return dist.ProcessGroupGloo(store, rank, size, options), kind.GLOO, torch.device("cpu")
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        device = torch.device("cuda", torch.cuda.current_device())
        return dist.ProcessGroupNCCL(store, rank, size, options), kind.NCCL, device
    raise ValueError(f"unknown backend {backend!r}; choose gloo, nccl or emulated")


def _gloo_device(own_host: str | None) -> Any:
    """GLOO_SOCKET_IFNAME (torch's variable: an interface, or several, comma-separated)
    wins, as it does for torch's own groups; else this rank's node address; else what
    the hostname resolves to."""
    import torch.distributed as dist
    gloo = dist.ProcessGroupGloo
    interface = os.environ.get("GLOO_SOCKET_IFNAME")
    if interface:
        return gloo.create_device(interface=interface.split(",")[0])
    return gloo.create_device(hostname=own_host) if own_host else gloo.create_default_device()


def leave_group(membership: GroupMembership) -> None:
    if isinstance(membership.group, EmulatedGroup):
        return
    unregister(membership.group)
    shutdown = getattr(membership.group, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:
            pass  # best effort: a peer may already be gone
    membership.store.close()
