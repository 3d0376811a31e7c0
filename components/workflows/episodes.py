"""Multi-turn episodes: the state of one, and the driver that runs many at once.

One episode is a ReAct loop over a rollout engine and the tools:

    turn = generate(context)                  routed: a follow-up turn prefers the engine
    reply = parse_turn(turn)                  holding its prefix (DataRouter, `prefer`)
    Call      -> run the tool, append the observation (mask 0), next turn
    Malformed -> append a short error observation (mask 0), next turn; counted
    Answer    -> done; so is the turn cap or the context budget

`next_action` is the pure decision; `EpisodeDriver` is the thin async loop around
it, written against two callables (`submit` a turn to a rank, `call_tool`) so the
training workflow (channels + ToolWorker) and `dynarl bench agentic` (engines in
process) run the very same episode logic. Re-prefill is measured, not modelled:
context the previous turn's engine had computed minus the prompt tokens the
serving engine's prefix cache supplied.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from dynarl.components.tasks.problem import stable_seed
from dynarl.components.tasks.tool_syntax import (Answer, Call, Malformed, malformed_observation,
                                                 observation_text, parse_turn)
from dynarl.core.data_router import DataRouter, ItemStatus, WorkerState


@dataclass(slots=True)
class Episode:
    id: str
    prompt_ids: list[int]
    seed: int
    response: list[int] = field(default_factory=list)
    """Every token after the prompt: model turns and observations."""
    mask: list[int] = field(default_factory=list)
    """Per response token: 1 = the model's (in the loss), 0 = an observation."""
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    malformed: int = 0
    tool_errors: int = 0
    answer: str = ""
    finish: str = ""
    """How the episode ended: 'answer', 'turn_cap', 'length' (context budget)."""
    version: int = -1
    status: ItemStatus = field(default_factory=ItemStatus)
    computed: int = 0
    """Context tokens whose KV the last serving engine computed (prompt + model turns)."""

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int
    max_new_tokens: int
    """Per turn."""
    max_context: int
    """Prompt + response tokens, at most (the model's positions)."""
    max_observation_chars: int = 24


def next_action(reply: Call | Answer | Malformed, turns: int, context_len: int, limits: Limits) -> str:
    """What an episode does after a turn: 'answer' | 'call' | 'malformed' | 'turn_cap' | 'length'.
    A call or a malformed turn continues only when another turn fits."""
    if isinstance(reply, Answer):
        return "answer"
    if turns >= limits.max_turns:
        return "turn_cap"
    if context_len + limits.max_observation_chars + 2 > limits.max_context:
        return "length"
    return "call" if isinstance(reply, Call) else "malformed"


Submit = Callable[[int, dict[str, Any]], Awaitable[None]]
"""(rank, turn request) -> queued on that rank."""
CallTool = Callable[[str, str], Awaitable[dict[str, Any]]]
"""(tool, argument) -> {"ok", "stdout", "error"}."""


class EpisodeDriver:
    def __init__(self, tokenizer: Any, limits: Limits, num_ranks: int, submit: Submit, call_tool: CallTool, *,
                 affinity: str = "prefer", capacity: int = 256, saturation: float = 0.9,
                 close_id: int | None = None, decode: Callable[[list[int]], str] | None = None) -> None:
        self.tokenizer, self.limits, self.num_ranks = tokenizer, limits, num_ranks
        self.submit, self.call_tool = submit, call_tool
        self.affinity = affinity
        self.capacity = capacity
        """Outstanding turns at which a rank counts as full (load 1.0) for routing."""
        self.router = DataRouter(saturation=saturation)
        self.close_id = close_id if close_id is not None else tokenizer.encode("]")[0]
        self.decode = decode or tokenizer.decode
        self.outstanding = [0] * num_ranks
        """Turns out per rank; an episode has one at a time, on ep.status.last_worker."""
        self.reprefill_tokens = 0
        self.max_wait_s = 0.0
        self.turns = 0
        self.calls_by_tool: Counter[str] = Counter()

    async def route(self, ep: Episode) -> None:
        loads = {str(r): WorkerState(min(1.0, n / self.capacity)) for r, n in enumerate(self.outstanding)}
        rank = int(self.router.distribute(ep.status, loads).worker)
        rid = f"{ep.id}#{ep.turns}"
        self.outstanding[rank] += 1
        budget = self.limits.max_context - len(ep.context)
        await self.submit(rank, {"id": rid, "prompt_ids": ep.context,
                                 "seed": stable_seed(ep.seed, "turn", ep.turns), "tool_count": ep.tool_calls,
                                 "max_new_tokens": min(self.limits.max_new_tokens, budget)})

    async def on_result(self, ep: Episode, result: dict[str, Any]) -> bool:
        """Takes one finished turn; True when the episode is over."""
        self.outstanding[int(ep.status.last_worker)] -= 1
        if ep.turns > 0:
            self.reprefill_tokens += max(0, ep.computed - result["cached_tokens"])
        self.turns += 1
        self.max_wait_s = max(self.max_wait_s, result["wait_s"])
        out = list(result["output_ids"])
        ep.response += out
        ep.mask += [1] * len(out)
        ep.logprobs += list(result["logprobs"])
        ep.turns += 1
        ep.version = result["version"]
        ep.computed = len(ep.context)
        ep.status.cached_prefix = ep.computed
        ep.status.steps = ep.turns
        stopped_on_close = result["finish"] == "stop" and bool(out) and out[-1] == self.close_id
        body = out[:-1] if out and out[-1] == self.tokenizer.eos_id else out
        reply = parse_turn(self.decode(body), stopped_on_close)
        action = next_action(reply, ep.turns, len(ep.context), self.limits)
        if action == "answer":
            ep.answer, ep.finish = reply.text, "answer"
            return True
        if action in ("turn_cap", "length"):
            ep.finish = action
            return True
        if action == "call":
            ep.tool_calls += 1
            ep.status.tool_calls = ep.tool_calls
            self.calls_by_tool[reply.tool] += 1
            outcome = await self.call_tool(reply.tool, reply.argument)
            if not outcome["ok"]:
                ep.tool_errors += 1
            text = observation_text(outcome["ok"], outcome["stdout"], outcome["error"],
                                    self.limits.max_observation_chars)
        else:
            ep.malformed += 1
            text = malformed_observation(reply.reason, self.limits.max_observation_chars)
        obs = self.tokenizer.encode(text)
        ep.response += obs
        ep.mask += [0] * len(obs)
        ep.logprobs += [0.0] * len(obs)
        await self.route(ep)
        return False

    async def run(self, episodes: list[Episode], results: Callable[[], Awaitable[dict[str, Any]]],
                  on_done: Callable[[Episode], Awaitable[None]] | None = None) -> None:
        """Starts every episode and feeds turn results back until all are over.
        Tool calls of different episodes run concurrently."""
        for ep in episodes:
            ep.status.affinity = self.affinity  # type: ignore[assignment]
        by_id = {ep.id: ep for ep in episodes}
        events: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            while True:
                await events.put(("result", await results()))

        async def handle(ep: Episode, result: dict) -> None:
            if await self.on_result(ep, result):
                await events.put(("done", ep))

        for ep in episodes:
            await self.route(ep)
        left = len(episodes)
        async with asyncio.TaskGroup() as tasks:
            feeder = tasks.create_task(pump())
            while left:
                kind, value = await events.get()
                if kind == "result":
                    tasks.create_task(handle(by_id[value["id"].rsplit("#", 1)[0]], value))
                    continue
                left -= 1
                if on_done is not None:
                    await on_done(value)
            feeder.cancel()  # every episode is over: no turn result is still coming
