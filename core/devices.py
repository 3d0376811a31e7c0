"""Devices and placement: which device each rank of a group runs on.

Placement is a pure function of the pool and current load, tested with tables.
"""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.core.config import ClusterConfig


@dataclass(frozen=True, slots=True)
class Device:
    id: int
    node: int
    local_index: int
    kind: str

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.id}"


class DevicePool:
    def __init__(self, cluster: ClusterConfig) -> None:
        self.devices = [Device(i, i // cluster.devices_per_node, i % cluster.devices_per_node, cluster.device_kind)
                        for i in range(cluster.num_devices)]
        self.placed: dict[str, list[int]] = {}
        """group name -> device id of each rank."""

    def __len__(self) -> int:
        return len(self.devices)

    def load(self) -> dict[int, int]:
        counts = {d.id: 0 for d in self.devices}
        for ids in self.placed.values():
            for i in set(ids):
                counts[i] += 1
        return counts

    def place(self, group: str, num_ranks: int | None, devices: list[int] | None) -> list[int]:
        ids = resolve_placement(len(self.devices), self.load(), num_ranks, devices)
        self.placed[group] = ids
        return ids

    def release(self, group: str) -> None:
        self.placed.pop(group, None)

    def extend(self, group: str, devices: list[int]) -> list[int]:
        """More ranks for an existing group, on explicit devices."""
        ids = resolve_placement(len(self.devices), self.load(), None, devices)
        self.placed.setdefault(group, []).extend(ids)
        return ids

    def shrink(self, group: str, devices: list[int]) -> None:
        """Frees one placement per listed device id (the ranks that stopped)."""
        placed = self.placed.get(group, [])
        for device in devices:
            placed.remove(device)


def resolve_placement(num_devices: int, load: dict[int, int], num_ranks: int | None,
                      devices: list[int] | None) -> list[int]:
    """Device id per rank. Explicit `devices` give one rank per entry (repeats allowed:
    several ranks may share a device). Otherwise `num_ranks` least-loaded devices,
    lowest id first, so groups spread before they share."""
    if devices is not None:
        if not devices:
            raise ValueError("devices must not be empty")
        bad = [d for d in devices if not 0 <= d < num_devices]
        if bad:
            raise ValueError(f"device ids {bad} out of range: the cluster has devices 0..{num_devices - 1}")
        if num_ranks is not None and num_ranks != len(devices):
            raise ValueError(f"num_ranks={num_ranks} but {len(devices)} devices given")
        return list(devices)
    if num_ranks is None or num_ranks < 1:
        raise ValueError("give num_ranks >= 1 or an explicit device list")
    if num_ranks > num_devices:
        raise ValueError(f"{num_ranks} ranks need {num_ranks} devices but the cluster has {num_devices}; "
                         "pass explicit devices to share them")
    order = sorted(range(num_devices), key=lambda d: (load.get(d, 0), d))
    return sorted(order[:num_ranks])
