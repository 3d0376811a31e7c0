"""The `agentic:` section of `dynarl train`: multi-turn episodes with tools."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.workflows.config_checks import at_least_one


@dataclass(kw_only=True, slots=True)
class AgenticSection:
    max_turns: int = 3
    """Model turns per episode, at most (a tool call and its answer take two)."""
    queue: Literal["fifo", "priority"] = "priority"
    """Each rollout engine's waiting queue: arrival order, or DynaRL's
    (tool_count, cached_prefix) priority with bounded overtaking (core/priority.py)."""
    affinity: Literal["prefer", "none"] = "prefer"
    """prefer: a follow-up turn goes back to the engine holding its prefix unless that
    engine is saturated; none: every turn to the least loaded engine."""
    max_bonus_s: float = 30.0
    """priority only: the overtaking window, the bound on how long a turn can be passed over."""
    max_observation_chars: int = 24
    """A tool's output beyond this is cut before the model reads it."""
    python_timeout_s: float = 5.0
    """Wall-clock limit of one `[py ...]` call in the sandbox."""
    tools: list[Literal["calc", "py"]] = field(default_factory=lambda: ["calc", "py"])
    """The tools an episode may call: calc (the calculator, arithmetic only) and py (model
    code in the bubblewrap sandbox: needs `bwrap`, checked before any worker starts). A
    react turn calling a tool not listed reads an error observation; without py an agent's
    sandbox.python answers an error."""
    episodes: Literal["react", "scripted", "agent"] = "react"
    """react: the model's text decides each turn and the tools run in the sandbox;
    scripted: each sample's script (a simulated workload's, dynarl sim) gives its
    turns' lengths, tool latencies and observation lengths; agent: the `agent:` section's
    function plays each episode over the job's OpenAI-compatible endpoint."""

    def __post_init__(self) -> None:
        at_least_one(self, "max_turns", "max_observation_chars")
        if self.max_bonus_s < 0:
            raise ValueError(f"max_bonus_s must be >= 0, got {self.max_bonus_s}")
        if self.episodes not in ("react", "scripted", "agent"):
            raise ValueError(f"episodes must be 'react', 'scripted' or 'agent', got {self.episodes!r}")
        if not self.tools or len(set(self.tools)) != len(self.tools):
            raise ValueError(f"tools must list distinct tools of calc, py; got {self.tools!r}")
        if self.python_timeout_s <= 0:
            raise ValueError(f"python_timeout_s must be > 0, got {self.python_timeout_s}")
