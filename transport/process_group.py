"""torch.distributed process groups created and destroyed while the job runs.

Each group gets its own TCPStore (hosted by its rank 0) and key prefix, and is
built directly as a ProcessGroupGloo/NCCL object rather than through
init_process_group: a process can then belong to many groups at once and leave
and rejoin with a different member set, which trainer resharding needs. Plain
`dist.all_reduce(t, group=pg)` works on such groups (checked on torch 2.13).

These calls block (rendezvous), so callers run them in a thread.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class GroupMembership:
    name: str
    rank: int
    size: int
    group: Any
    store: Any


def host_store(host: str) -> Any:
    """Starts a TCPStore server on a free port; the caller reads `.port`."""
    import torch.distributed as dist
    return dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=60))


def join_group(name: str, generation: int, rank: int, size: int, host: str, port: int,
               backend: str, timeout_s: float, store: Any = None) -> GroupMembership:
    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    # A fresh prefix per generation keeps a rebuilt group's keys apart from the old one's.
    prefixed = dist.PrefixStore(f"dynarl/{name}/{generation}/", store)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    elif backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        group = dist.ProcessGroupNCCL(prefixed, rank, size, options)
    else:
        raise ValueError(f"unknown backend {backend!r}; choose gloo or nccl")
    return GroupMembership(name, rank, size, group, store)


def leave_group(membership: GroupMembership) -> None:
    shutdown = getattr(membership.group, "shutdown", None)
    if shutdown is not None:
        try:
            shutdown()
        except Exception:
            pass  # best effort: a peer may already be gone
