"""What a finished turn of an episode leads to: ReactTurns parses the model's text and
calls the tools; ScriptedTurns plays a simulated workload's script (dynarl sim);
AgentTurns waits for what an agent on the OpenAI endpoint asks next (components/agents)."""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Awaitable, Callable

from dynarl.components.tasks.tool_syntax import malformed_observation, observation_text, parse_turn
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.workflows.episode import Episode, Limits, next_action
from dynarl.components.workloads.prompts import token_ids

CallTool = Callable[[str, str], Awaitable[ToolResult]]
"""(tool, argument) -> what the tool gave back."""


class ReactTurns:
    """What a turn leads to when the model's text decides (ReAct): a parsed tool call
    runs in the tools, a malformed one gets an error observation, an answer ends it."""

    def __init__(self, tokenizer: Any, limits: Limits, call_tool: CallTool, *, close_id: int | None = None,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.tokenizer, self.limits, self.call_tool = tokenizer, limits, call_tool
        self.close_id = close_id if close_id is not None else tokenizer.encode("]")[0]
        self.decode = decode or tokenizer.decode
        self.calls_by_tool: Counter[str] = Counter()

    def budget(self, ep: Episode) -> int:
        """The next turn's max_new_tokens."""
        return min(self.limits.max_new_tokens, self.limits.max_context - len(ep.context))

    def tool_count(self, ep: Episode) -> int:
        """The priority's tool_count of the episode's next turn: its tool calls so far."""
        return ep.tool_calls

    async def reply(self, ep: Episode, out: list[int], finish: str) -> list[int] | None:
        """The observation the episode reads next (mask 0), or None when it is over."""
        stopped_on_close = finish == "stop" and bool(out) and out[-1] == self.close_id
        body = out[:-1] if out and out[-1] == self.tokenizer.eos_id else out
        reply = parse_turn(self.decode(body), stopped_on_close)
        action = next_action(reply, ep.turns, len(ep.context), self.limits)
        if action == "answer":
            ep.answer, ep.finish = reply.text, "answer"
            return None
        if action in ("turn_cap", "length"):
            ep.finish = action
            return None
        if action == "call":
            ep.tool_calls += 1
            self.calls_by_tool[reply.tool] += 1
            outcome = await self.call_tool(reply.tool, reply.argument)
            if not outcome.ok:
                ep.tool_errors += 1
            text = observation_text(outcome.ok, outcome.stdout, outcome.error, self.limits.max_observation_chars)
        else:
            ep.malformed += 1
            text = malformed_observation(reply.reason, self.limits.max_observation_chars)
        return self.tokenizer.encode(text)


class ScriptedTurns:
    """What a turn leads to when a simulated workload's script decides (dynarl sim):
    turn k makes exactly the script's tokens, then its tool runs for the script's
    latency (off the device, in the run's time) and returns the script's number of
    observation tokens (ids a pure function of the turn), until the last turn."""

    def __init__(self, scripts: dict[str, list[list]], vocab_size: int, time_scale: float = 1.0) -> None:
        self.scripts = scripts
        """Episode id -> [[gen_tokens, tool_latency_s, obs_tokens], ...]."""
        self.vocab_size, self.time_scale = vocab_size, time_scale
        self.calls_by_tool: Counter[str] = Counter()

    def budget(self, ep: Episode) -> int:
        return int(self.scripts[ep.id][ep.turns][0])

    def tool_count(self, ep: Episode) -> int:
        return ep.tool_calls

    async def reply(self, ep: Episode, out: list[int], finish: str) -> list[int] | None:
        script = self.scripts[ep.id]
        k = ep.turns - 1  # the turn just finished
        if k == len(script) - 1:
            ep.finish = "answer"
            return None
        _, latency, obs = script[k]
        ep.tool_calls += 1
        self.calls_by_tool["script"] += 1
        if latency > 0:
            await asyncio.sleep(latency * self.time_scale)
        return token_ids(f"{ep.id}#{k}", int(obs), self.vocab_size) if obs else []


class AgentTurns:
    """What a turn leads to when an agent's requests decide: the turn answers the request
    waiting for it, and the agent's next request gives the next turn's new ids (its new
    messages, masked out of the loss); the agent's return ends the episode. An episode
    begins when its agent's first request arrives (`begin`)."""

    def __init__(self, sessions: Any) -> None:
        self.sessions = sessions
        """components/agents/sessions.py Sessions: the step's sessions, one per episode."""

    @property
    def calls_by_tool(self) -> Counter[str]:
        return self.sessions.calls_by_tool

    async def begin(self, ep: Episode) -> bool:
        """Once the agent's first request is in (its prompt is the episode's): True; False
        if the agent ended without one."""
        return bool(await self.sessions.by_episode[ep.id].started)

    def budget(self, ep: Episode) -> int:
        return self.sessions.budget(ep)

    def tool_count(self, ep: Episode) -> int:
        """The priority's tool_count of an agent's turn: the session's turns so far (every
        follow-up request comes after the agent acted on a reply)."""
        return ep.turns

    async def reply(self, ep: Episode, out: list[int], finish: str) -> list[int] | None:
        new = await self.sessions.turn_done(ep, out, finish)
        if new is None:
            ep.finish = "failed" if self.sessions.by_episode[ep.id].failure else "answer"
        return new


Turns = ReactTurns | ScriptedTurns | AgentTurns
