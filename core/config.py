"""The runtime's own configuration: cluster shape, launcher, liveness bounds."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    num_nodes: int = 1
    """Nodes in the job; under `agent` this must equal the number of agents."""
    devices_per_node: int = 2
    """Accelerators per node, or logical CPU devices when device_kind is cpu."""
    device_kind: Literal["cpu", "cuda", "emulated"] = "cpu"
    """emulated: devices that exist only in a simulation (`dynarl sim`): workers run
    emulated engines that spend cost-model time, and process groups are membership
    records with no collectives (transport/process_group.py EmulatedGroup)."""
    device_memory_gb: float | None = None
    """Memory of one device in GB (1e9 bytes), what the memory plan of `dynarl train`
    fits each device's peak into. None: 80 for cuda (an H100 80GB), for cpu the
    host's physical memory shared evenly by devices_per_node; emulated devices take
    their cost model's."""

    def __post_init__(self) -> None:
        if self.num_nodes < 1:
            raise ValueError(f"num_nodes must be >= 1, got {self.num_nodes}")
        if self.devices_per_node < 1:
            raise ValueError(f"devices_per_node must be >= 1, got {self.devices_per_node}")
        if self.device_memory_gb is not None and (isinstance(self.device_memory_gb, bool)
                                                  or not self.device_memory_gb > 0):
            raise ValueError(f"device_memory_gb must be > 0 or null, got {self.device_memory_gb!r}")

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node


@dataclass(kw_only=True, slots=True)
class RuntimeConfig:
    launcher: Literal["local", "inproc", "agent"] = "local"
    """local: subprocesses on this host; inproc: workers as objects in the
    controller's loop (tests, simulation); agent: node agents started by torchrun/srun."""
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    bind_host: str = "127.0.0.1"
    """Address the controller's socket binds to. Loopback unless workers run on other
    nodes (then 0.0.0.0 or node 0's address; launch/node_host.py says what is advertised)."""
    heartbeat_interval_s: float = 0.5
    """Seconds between a worker's heartbeats to the controller."""
    heartbeat_timeout_s: float = 5.0
    """A worker silent for this long is reported as WorkerLost."""
    hang_timeout_s: float = 300.0
    """A worker whose event loop has not ticked for this long is reported as WorkerLost.
    Generous by default: a long synchronous compute step blocks the loop legitimately."""
    spawn_timeout_s: float = 60.0
    """How long a worker may take to start and report ready."""
    shutdown_grace_s: float = 3.0
    """How long a stopping worker may take before it is terminated, then killed."""
    max_message_bytes: int = 512 << 20
    """The largest control message (an RPC, a channel item up to 256 KB, a heartbeat):
    larger frames are dropped before they are allocated (transport/wire.py
    DEFAULT_MAX_MESSAGE_BYTES, the same)."""
    trace_path: str | None = None
    """Where to write the Chrome/Perfetto trace when the controller closes."""
    worker_threads: int | None = 1
    """torch intra-op threads per worker process (CPU runs share few cores). null: the
    workflow's choice per group (`dynarl train`: components/placement/threads.py), else 1."""

    def __post_init__(self) -> None:
        for name in ("heartbeat_interval_s", "heartbeat_timeout_s", "hang_timeout_s",
                     "spawn_timeout_s", "shutdown_grace_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError("heartbeat_timeout_s must exceed heartbeat_interval_s")
        if self.max_message_bytes < 1024:
            raise ValueError("max_message_bytes must be >= 1024")
        if self.worker_threads is not None and self.worker_threads < 1:
            raise ValueError("worker_threads must be >= 1")
