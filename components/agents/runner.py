"""Running the user's agent: one call of `fn(client, sample)` per episode, on the job's
loop, with an OpenAI client bound to the episode's session; its result is the
episode's reward. A raise or a timeout fails that episode alone (counted; dropped
from the loss), never the run."""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import logging
import math
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from dynarl.components.agents.sessions import Session, Sessions
from dynarl.components.experience import PromptGroup, group_advantages
from dynarl.components.trainer.advantages import group_advantages_for
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.tools.worker import ToolWorker
from dynarl.components.workflows.episode import Episode

log = logging.getLogger(__name__)

Agent = Callable[[Any, "AgentSample"], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class AgentSample:
    """What an agent is given for one episode."""
    id: str
    prompt: str
    """The task's problem text."""
    answer: str
    """The task's reference answer (for the agent's own reward)."""
    group: int
    """Its prompt's index in the step; a group's episodes share the prompt."""
    index: int
    """Its place among the group's episodes."""
    sandbox: "Sandbox | None" = None
    """The project's tools, for an agent to offer its model."""


class Sandbox:
    """The project's tools an agent may call: Python in the sandbox (no network, limits,
    components/tools/python_sandbox.py) and the calculator, run by the job's tool worker."""

    def __init__(self, tools: Any, timeout_s: float) -> None:
        self.tools, self.timeout_s = tools, timeout_s

    async def python(self, code: str) -> ToolResult:
        return (await self.tools.call(ToolWorker.python, code, self.timeout_s))[0]

    async def calculator(self, expression: str) -> ToolResult:
        return (await self.tools.call(ToolWorker.calculator, expression))[0]


def load_agent(function: str) -> Agent:
    """`module:fn` imported; a clear error when it is missing or not a coroutine function."""
    module_name, _, name = function.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"agent.function: cannot import {module_name!r}: {exc}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"agent.function: {module_name!r} has no {name!r}")
    if not asyncio.iscoroutinefunction(fn):
        raise ValueError(f"agent.function: {function} must be an async def (client, sample)")
    return fn


def reward_of(result: Any) -> tuple[float, dict[str, float]]:
    """An agent's result as (reward, named scores): a number, a mapping with "reward"
    (its other numbers are scores), or a record with a `reward` field."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)
    if isinstance(result, Mapping):
        scores = {str(k): float(v) for k, v in result.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if "reward" not in scores:
            raise ValueError(f"an agent's scores need a numeric 'reward', got {sorted(result)}")
        reward = scores.pop("reward")
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        reward, scores = float(result), {}
    else:
        raise ValueError(f"an agent returns a number or a mapping with 'reward', got {type(result).__name__}")
    if not math.isfinite(reward):
        raise ValueError(f"an agent's reward must be finite, got {reward}")
    return reward, scores


async def play_episode(fn: Agent, client: Any, sessions: Sessions, session: Session, sample: AgentSample,
                       timeout_s: float, failed: Callable[[], None] | None = None) -> None:
    """The agent plays one episode; whatever happens, its session is finished.
    `failed` is called at once when the agent raised or timed out (a retry replaces
    the episode before the driver ends it)."""
    try:
        async with asyncio.timeout(timeout_s):
            result = await fn(client, sample)
        reward, scores = reward_of(result)
    except asyncio.CancelledError:
        sessions.finish(session, failure="cancelled")
        raise
    except TimeoutError:
        log.warning("agent episode %s: timed out after %.0f s (agent.timeout_s)", sample.id, timeout_s)
        sessions.finish(session, failure="timeout")
        if failed is not None:
            failed()
    except Exception as exc:  # the agent's own error: this episode fails, the run goes on
        log.warning("agent episode %s failed: %s: %s", sample.id, type(exc).__name__, exc)
        sessions.finish(session, failure=type(exc).__name__)
        if failed is not None:
            failed()
    else:
        sessions.finish(session, reward, scores)
    finally:
        await client.close()


def finish_group(group: PromptGroup, episodes: Sequence[Episode], failed: Sequence[bool],
                 rewards: Sequence[float], end_id: int, eps: float, engine: TrainerConfig | None = None) -> None:
    """A group's episodes into its samples. The group's prompt is the prefix its
    episodes' prompts share (usually the whole first prompt; never their responses,
    which may start alike); each sample's output is
    the rest of its context, its own prompt part masked. A failed episode is kept
    with every token masked and advantage 0; the others' advantages are over them alone
    (the objective of `engine`, the trainer's settings; None: GRPO's with `eps`)."""
    live = [ep.prompt_ids for ep, bad in zip(episodes, failed) if not bad and ep.prompt_ids]
    if live:  # (none: every episode failed; the task's prompt stands in)
        common = shared_prefix(live) or live[0][:1]
        group.prompt_ids = list(common)
    common = list(group.prompt_ids)
    kept = [not bad and ep.context[:len(common)] == common and len(ep.context) > len(common)
            for ep, bad in zip(episodes, failed)]
    kept_rewards = [r for r, k in zip(rewards, kept) if k]
    if engine is None:
        advantages = iter(group_advantages(kept_rewards, eps))
    else:
        lengths = [len(ep.context) - len(common) for ep, k in zip(episodes, kept) if k]
        advantages = iter(group_advantages_for(engine, kept_rewards, lengths))
    for sample, ep, keep, reward in zip(group.samples, episodes, kept, rewards):
        if keep:
            own = len(ep.prompt_ids) - len(common)  # the episode's prompt past the shared part
            sample.output_ids = ep.context[len(common):]
            sample.mask = [0] * own + list(ep.mask)
            sample.logprobs = [0.0] * own + list(ep.logprobs)
            sample.reward, sample.advantage = reward, next(advantages)
        else:
            sample.output_ids, sample.mask, sample.logprobs = [end_id], [0], [0.0]
            sample.reward, sample.advantage = 0.0, 0.0
        sample.finish = (ep.finish or "failed") if keep else DROPPED
        sample.version = ep.oldest
        sample.segments = None
        sample.episode = None


DROPPED = "dropped"
"""A sample's finish when its episode is left out of the loss (failed, or no turn)."""


def own_groups(group_ids: Sequence[int], finishes: Sequence[str]) -> list[int]:
    """A batch's group ids with each dropped sample in a group of its own: a trainer that
    computes advantages from rewards by group then gives it 0 and leaves it out of its
    group's mean and spread (finish_group's advantages, which the trainer recomputes)."""
    first = max(group_ids, default=-1) + 1
    return [first + i if finish == DROPPED else g for i, (g, finish) in enumerate(zip(group_ids, finishes))]


def shared_prefix(sequences: Sequence[Sequence[int]]) -> list[int]:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences):
            return list(first[:i])
    return list(first[:n])
