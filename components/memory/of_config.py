"""The memory plan of a `dynarl train` config: the device's memory and the planned
sequence length resolved from the config, then `plan.plan_memory`."""
from __future__ import annotations

import os
from typing import Any

from dynarl.components.memory.plan import MemoryPlan, plan_memory

GPU_DEFAULT_BYTES = 80 * 10**9
"""runtime.cluster.device_memory_gb unset on cuda: an H100 80GB."""


def device_bytes(cluster: Any) -> int:
    """One device's memory: the configured GB, else an H100's on cuda, else the
    host's physical memory shared by the node's logical CPU devices."""
    if cluster.device_memory_gb is not None:
        return int(cluster.device_memory_gb * 10**9)
    if cluster.device_kind == "cuda":
        return GPU_DEFAULT_BYTES
    return host_memory_bytes() // cluster.devices_per_node


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def seq_len(cfg: Any) -> int:
    """The longest sequence the plan sizes activations for."""
    return min(cfg.memory.prompt_tokens + cfg.rollout.max_new_tokens, cfg.model.config().max_position_embeddings)


def plan_of(cfg: Any) -> MemoryPlan | None:
    """The plan of a validated config; None where there is none to make: emulated
    devices (their cost model sizes them), the embodied workflow (a small policy),
    placement auto (planned at start from a profile)."""
    cluster = cfg.runtime.cluster
    if cluster.device_kind == "emulated" or cfg.workflow == "embodied" or cfg.placement.mode == "auto":
        return None
    return plan_memory(cfg, cfg.model.config(), cfg.devices(), cluster.device_kind, device_bytes(cluster),
                       seq_len(cfg))
