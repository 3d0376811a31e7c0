"""Waiting-queue order for a rollout engine, chosen by config: FIFO, or DynaRL's
(tool_count, cached_prefix) priority with its bounded overtaking window
(core/priority.py states and tests the bound), which turns to FIFO where the turns
the engine finished show later turns longer than first ones, and keys FIFO the turns
of an index whose finished turns are longer than first ones (TurnLengths.turn_keeps_bonus)."""
from __future__ import annotations

from typing import Literal

from dynarl.components.rollout.base import GenerationRequest, QueueKey
from dynarl.core.priority import PriorityConfig, TurnLengths, priority_key


def make_queue_key(policy: Literal["fifo", "priority"], config: PriorityConfig | None = None,
                   lengths: TurnLengths | None = None) -> QueueKey | None:
    """None means the engine's own FIFO order. `lengths`: what the engine's finished
    turns say of the priority's assumption (fed by its caller); once they refute it,
    requests enqueued from then on are keyed FIFO."""
    if policy == "fifo":
        return None
    if policy != "priority":
        raise ValueError(f"unknown queue policy {policy!r}; choose fifo or priority")
    config = config or PriorityConfig()

    def key(request: GenerationRequest, cached_prefix: int) -> float:
        if lengths is not None and not lengths.turn_keeps_bonus(request.tool_count):
            return request.arrival_time
        return priority_key(request.arrival_time, request.tool_count, cached_prefix, config)
    return key
