"""The base class of everything that runs on a device.

Subclass `Worker` and write async (or plain) methods; the controller calls them
on every rank of a WorkerGroup (SPMD) or on chosen ranks. Public methods (no
leading underscore) are callable remotely; arguments and results must be plain
data, numpy arrays or torch tensors (msgpack, never pickle).

The runtime fills in rank, world_size, devices and friends *before* `__init__`
runs, so a constructor may use them.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from dynarl.core.devices import Device
    from dynarl.core.worker_runtime import WorkerRuntime


@dataclass(slots=True)
class WorkerSpec:
    """Everything a launcher needs to start one rank."""
    worker_id: str
    group: str
    rank: int
    world_size: int
    local_rank: int
    node: int
    devices: list[int]
    """Global device id of this rank's device(s)."""
    device_kind: str
    cls_path: str
    """"module:QualName" of the Worker subclass."""
    main_file: str | None = None
    """Path of the user's script when the class lives in __main__."""
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    """The constructor's arguments: plain data and config dataclasses (wire_config)."""
    init_wire: dict[str, Any] | None = None
    """init_kwargs as they crossed a process boundary (`to_wire`): their msgpack, hex, and
    the modules that define their records; the runtime decodes them (`init`)."""
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    """torchrun-compatible rendezvous address reserved for this group."""
    threads: int = 1
    local_world_size: int = 1
    """Ranks of this group on this rank's node."""
    local_devices: list[int] = field(default_factory=list)
    """The same devices as indices on their node (what CUDA_VISIBLE_DEVICES takes)."""

    def env(self) -> dict[str, str]:
        """torchrun-compatible environment for the rank's process."""
        env = {
            "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node),
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "DYNARL_DEVICES": ",".join(map(str, self.devices)),
            "DYNARL_DEVICE_KIND": self.device_kind,
            "OMP_NUM_THREADS": str(self.threads),
        }
        if self.device_kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.local_devices))
        return env

    def to_wire(self) -> dict[str, Any]:
        """JSON- and msgpack-safe: the constructor's arguments as one wire record."""
        d = {name: getattr(self, name) for name in self.__slots__}
        if self.init_wire is None:
            d["init_wire"], d["init_kwargs"] = encode_init(self.init_kwargs), {}
        return d

    def init(self) -> dict[str, Any]:
        """The constructor's arguments (decoded, if they crossed a process boundary)."""
        return self.init_kwargs if self.init_wire is None else decode_init(self.init_wire)


def rank_specs(group: str, cls_path: str, devices: Sequence[Device], *, first_rank: int, main_file: str | None,
               init: dict[str, Any], master_addr: str, master_port: int, threads: int) -> list[WorkerSpec]:
    """One rank per device, numbered from `first_rank`; a rank's local rank counts the
    ranks on its node among these."""
    per_node: dict[int, int] = {}
    specs = []
    for rank, device in enumerate(devices, start=first_rank):
        local_rank = per_node.get(device.node, 0)
        per_node[device.node] = local_rank + 1
        specs.append(WorkerSpec(
            worker_id=f"{group}/{rank}/{secrets.token_hex(4)}", group=group, rank=rank,
            world_size=first_rank + len(devices), local_rank=local_rank, node=device.node, devices=[device.id],
            local_devices=[device.local_index], device_kind=device.kind, cls_path=cls_path, main_file=main_file,
            init_kwargs=init, master_addr=master_addr, master_port=master_port, threads=threads))
    for spec in specs:
        spec.local_world_size = per_node[spec.node]
    return specs


def encode_init(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A worker's constructor arguments as wire data (transport/wire.py: config records
    cross as themselves), with the modules the receiving process imports to decode them."""
    import dataclasses

    from dynarl.transport.wire import encode_blob
    blob = encode_blob(kwargs)
    if blob.frames:
        raise ValueError("a worker's constructor arguments hold no tensors or arrays")
    modules = sorted({type(v).__module__ for v in kwargs.values() if dataclasses.is_dataclass(v)})
    return {"msgpack": blob.body.hex(), "modules": modules}


def decode_init(wire: dict[str, Any]) -> dict[str, Any]:
    import importlib

    from dynarl.transport.wire import Blob, decode_blob
    for module in wire["modules"]:
        importlib.import_module(module)  # registers its records (the controller named them)
    return decode_blob(Blob(bytes.fromhex(wire["msgpack"]), []))


class Worker:
    rank: int
    world_size: int
    group_name: str
    devices: list[int]
    device_kind: str
    node: int
    _runtime: "WorkerRuntime"

    def _bind(self, runtime: "WorkerRuntime") -> None:
        spec = runtime.spec
        self._runtime = runtime
        self.rank = spec.rank
        self.world_size = spec.world_size
        self.group_name = spec.group
        self.devices = list(spec.devices)
        self.device_kind = spec.device_kind
        self.node = spec.node

    # --- hooks the runtime calls ------------------------------------------------
    async def setup(self) -> None:
        """Runs once after __init__, inside the worker's event loop."""

    async def onload(self) -> None:
        """device_lock acquired: move state onto the device."""

    async def offload(self) -> None:
        """device_lock about to be released: move state off the device."""

    async def teardown(self) -> None:
        """Runs once before the worker stops."""

    # --- services the runtime offers ----------------------------------------------
    def channel(self, name: str, *, prefetch: int = 1, window: int = 64) -> Any:
        """A handle on the controller's channel `name` (made on first use): `await
        put(item, key=None, weight=1.0)`, `await flush()`, `await get(key=None)`, `await
        get_batch(target_weight)` (transport/channel_client.py; docs/architecture.md,
        "Channels and records"). `prefetch` > 1 lets get()
        fetch several items per round trip (throughput) at the cost of coarser load
        balancing; `window` bounds puts in flight before put() waits."""
        return self._runtime.channel(name, prefetch=prefetch, window=window)

    def offer(self, value: Any) -> Any:
        """Keeps `value` in this process for another rank to `fetch` straight from here
        (a RemoteRef to hand it), skipping the controller; None where there is no data
        plane (the inproc launcher: pass the value itself)."""
        return self._runtime.offer(value)

    def withdraw(self, ref: Any) -> None:
        """Drops an offer nobody will fetch any more."""
        self._runtime.withdraw(ref)

    async def fetch(self, ref: Any) -> Any:
        """Another rank's offer (and tells it it may drop it). Raises PayloadLost."""
        return await self._runtime.fetch(ref)

    def process_group(self, name: str) -> Any:
        """The torch.distributed ProcessGroup named `name` that includes this rank."""
        return self._runtime.process_group(name)

    @property
    def device(self) -> str:
        """torch device string for this rank's first device."""
        if self.device_kind == "cuda":
            return "cuda:0"  # CUDA_VISIBLE_DEVICES narrows to this rank's devices
        return "cpu"
