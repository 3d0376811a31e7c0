"""How a policy runs multi-turn (agentic) rollouts: the engines' queue order and the
affinity of a follow-up turn. Pure.

    queue     "priority": DynaRL's (tool_count, cached_prefix) key with a bounded
              overtaking window (core/priority.py, through components/rollout/queue_keys.py,
              the same function the native engine uses); "fifo": arrival order
    affinity  "prefer": a follow-up turn goes back to the engine holding its prefix unless
              that engine is gone or saturated (core/data_router.py); "none": any engine

dynarl and its variants use priority + prefer (DynaRL §4.3). The baselines (colocated,
spatial, rlinf-auto) use FIFO without affinity, as do the frameworks they stand for.
`dynarl-noprio` is dynarl's scheduler with the baselines' request handling: the
ablation the paper reports as "without priority" (1.06-1.38x over RLinf, against
1.27-1.64x with it). `dynarl-fifo` keeps the affinity and drops only the priority:
the order the priority must not lose to (on `agentic-rstar-grow`, whose later turns
grow, the priority's assumption fails and core/priority.py TurnLengths turns it FIFO;
on `agentic-rstar-bimodal` it keys FIFO only the turn indices whose turns it found longer).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynarl.components.placement.dynarl import Dynarl


@dataclass(frozen=True, slots=True)
class AgenticMode:
    queue: Literal["fifo", "priority"]
    affinity: Literal["prefer", "none"]

    def __post_init__(self) -> None:
        if self.queue not in ("fifo", "priority"):
            raise ValueError(f"queue must be 'fifo' or 'priority', got {self.queue!r}")
        if self.affinity not in ("prefer", "none"):
            raise ValueError(f"affinity must be 'prefer' or 'none', got {self.affinity!r}")


BASELINE = AgenticMode(queue="fifo", affinity="none")
DYNARL = AgenticMode(queue="priority", affinity="prefer")


def agentic_mode(policy: object) -> AgenticMode:
    """A policy's own `agentic` attribute if it has one; else dynarl's variants get
    DynaRL's mode and every other policy the baselines'."""
    mode = getattr(policy, "agentic", None)
    if mode is not None:
        return mode
    return DYNARL if isinstance(policy, Dynarl) else BASELINE


class DynarlNoPrio(Dynarl):
    """dynarl's device scheduling with FIFO queues and no cache affinity."""
    name = "dynarl-noprio"
    agentic = BASELINE


class DynarlFifo(Dynarl):
    """dynarl's device scheduling and cache affinity with FIFO queues."""
    name = "dynarl-fifo"
    agentic = AgenticMode(queue="fifo", affinity="prefer")
