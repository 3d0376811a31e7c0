"""How many torch threads a CPU rank gets (runtime.worker_threads null, device_kind cpu).

A device of a CPU cluster is a share of a node's cores. A component whose devices it
shares with others in time (temporal and colocated layouts) has the node to itself
while its stage runs: its ranks on the node split all the cores. A component on
devices of its own runs beside the others: each rank has its device's cores.
Measured on the TRL job (docs/benchmarks.md "Against TRL"): one trainer rank with
both cores of 2 trains its 128 samples in 0.44-0.51 s, with one core in 0.67 s.
"""
from __future__ import annotations


def rank_threads(cores: int, devices_per_node: int, ranks_on_node: int, time_shared: bool) -> int:
    """Torch intra-op threads of each of a component's ranks on one node."""
    if cores < 1 or devices_per_node < 1 or ranks_on_node < 1:
        raise ValueError(f"cores, devices_per_node and ranks_on_node must be >= 1, got "
                         f"{cores}, {devices_per_node}, {ranks_on_node}")
    if time_shared:
        return max(1, cores // ranks_on_node)
    return max(1, cores // devices_per_node)
