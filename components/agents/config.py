"""The `agent:` section of `dynarl train`: an agent written against the OpenAI API
(agentic.episodes agent), trained unmodified through the job's endpoint."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


@dataclass(kw_only=True, slots=True)
class AgentSection:
    function: str = "dynarl.components.agents.calc_agent:play"
    """`module:fn`, an `async def fn(client: openai.AsyncOpenAI, sample) -> float` (or a
    mapping of named scores with a "reward"): one episode; `sample` is an AgentSample
    (components/agents/runner.py). The default plays the built-in calc task as an
    OpenAI tools agent."""
    episodes_per_prompt: int = 0
    """A prompt's episodes, its GRPO group: rollout.samples_per_prompt (0: that value;
    set, it must equal it)."""
    tool_parser: Literal["auto", "hermes", "llama3"] = "auto"
    """How the model's tool-call text becomes OpenAI tool_calls: hermes (Hermes, Qwen2.5,
    Qwen3: <tool_call>{json}</tool_call>), llama3 (Llama 3's JSON), auto (from the
    tokenizer's chat template; hermes for the built-in tiny models)."""
    timeout_s: float = 300.0
    """One episode's wall-clock limit; past it the episode fails (on_failure)."""
    on_failure: Literal["drop", "retry"] = "drop"
    """An episode whose agent raised or timed out is counted (agent_failures) and then
    drop: kept with no token in the loss and left out of its group's advantages;
    retry: played again from the start, up to max_retries times, then dropped."""
    max_retries: int = 1
    """on_failure retry: the fresh attempts one episode may have."""
    host: str = "127.0.0.1"
    """The address the endpoint binds: loopback, or the job's own network's."""
    max_body_bytes: int = 1 << 20
    """A request body beyond this is refused (413) before it is read."""

    def __post_init__(self) -> None:
        if not _FUNCTION.match(self.function):
            raise ValueError(f"function must be 'module:function', got {self.function!r}")
        if self.episodes_per_prompt < 0:
            raise ValueError(f"episodes_per_prompt must be >= 0, got {self.episodes_per_prompt}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.tool_parser not in ("auto", "hermes", "llama3"):
            raise ValueError(f"tool_parser must be 'auto', 'hermes' or 'llama3', got {self.tool_parser!r}")
        if self.on_failure not in ("drop", "retry"):
            raise ValueError(f"on_failure must be 'drop' or 'retry', got {self.on_failure!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
