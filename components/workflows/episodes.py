"""Multi-turn episodes: the state of one, and the driver that runs many at once.

One episode is a ReAct loop over a rollout engine and the tools:

    turn = generate(context)                  routed: a follow-up turn prefers the engine
    reply = parse_turn(turn)                  holding its prefix (DataRouter, `prefer`)
    Call      -> run the tool, append the observation (mask 0), next turn
    Malformed -> append a short error observation (mask 0), next turn; counted
    Answer    -> done; so is the turn cap or the context budget

`next_action` is the pure decision; `EpisodeDriver` is the thin async loop around
it, written against a callable that submits a turn to a rank and a `turns` strategy
(what a finished turn leads to: ReactTurns parses the model's text and calls the
tools; ScriptedTurns plays a simulated workload's script, for `dynarl sim`), so the
training workflow, the simulator and `dynarl bench agentic` (engines in process)
run the very same episode logic. Re-prefill is measured, not modelled:
context the previous turn's engine had computed minus the prompt tokens the
serving engine's prefix cache supplied.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from dynarl.components.tasks.problem import stable_seed
from dynarl.components.workloads.prompts import token_ids
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
    group: int | None = None
    """Its prompt group: the group's episodes start on one rank (the prompt computed once)."""
    status: ItemStatus = field(default_factory=ItemStatus)
    computed: int = 0
    """Context tokens whose KV the last serving engine computed (prompt + model turns)."""
    segments: list[list[int]] = field(default_factory=list)
    """[first, end, weight version] of each run of response tokens one policy made."""
    pending: list | None = None
    """Partial rollout: the turn it was in when its step closed, [tokens so far, their
    log-probs, runs]: runs = [[end, version], ...], the weights that made each run of
    those tokens (a turn may be cut more than once); its next route continues it."""

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response

    @property
    def oldest(self) -> int:
        """The oldest weights that made any of its tokens (its version, -1: none made)."""
        versions = [v for _, _, v in self.segments] + [v for _, v in (self.pending[2] if self.pending else ())]
        return min(versions, default=self.version)

    def pending_segments(self, start: int) -> list[list[int]]:
        """The cut turn's runs as [first, end, version] from response position `start`."""
        out, first = [], 0
        for end, version in self.pending[2] if self.pending else ():
            if end > first:
                out.append([start + first, start + end, int(version)])
            first = end
        return out

    def state(self) -> "EpisodeState":
        return EpisodeState(self.turns, self.tool_calls, self.malformed, self.tool_errors, self.pending)

    @classmethod
    def resume(cls, id: str, prompt_ids: list[int], seed: int, group: int | None, response: list[int],
               mask: list[int], logprobs: list[float], segments: list[list[int]] | None,
               state: "EpisodeState") -> "Episode":
        """An episode carried unfinished from an earlier step, as its sample kept it."""
        return cls(id, prompt_ids, seed, list(response), list(mask), list(logprobs), state.turns, state.tool_calls,
                   state.malformed, state.tool_errors, group=group, segments=[list(x) for x in segments or ()],
                   pending=state.pending,  # (its KV, the cut turn's included, was an earlier step's)
                   computed=len(prompt_ids) + len(response) + len(state.pending[0] if state.pending else ()))


@dataclass(frozen=True, slots=True)
class EpisodeState:
    """What a carried episode's sample keeps beyond its tokens, mask and segments
    (Sample.episode, msgpack- and JSON-safe as its wire list)."""
    turns: int
    tool_calls: int
    malformed: int
    tool_errors: int
    pending: list | None
    """[tokens so far, log-probs, [[end, version], ...]] of the turn it was in, or None
    (between turns)."""

    def to_wire(self) -> list:
        return [self.turns, self.tool_calls, self.malformed, self.tool_errors, self.pending]

    @classmethod
    def from_wire(cls, values: list) -> "EpisodeState":
        if not isinstance(values, list) or len(values) != 5 or not all(isinstance(v, int) for v in values[:4]):
            raise ValueError(f"an episode's state is [turns, tool_calls, malformed, tool_errors, pending], "
                             f"got {values!r}")
        pending = values[4]
        if pending is not None and (not isinstance(pending, list) or len(pending) != 3
                                    or not isinstance(pending[2], list)
                                    or not all(isinstance(r, list) and len(r) == 2 for r in pending[2])):
            raise ValueError(f"an episode's pending turn is [tokens, logprobs, runs], got {pending!r}")
        return cls(*values)


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


Submit = Callable[[Any, dict[str, Any]], Awaitable[None]]
"""(rank key, turn request) -> queued on that rank."""
CallTool = Callable[[str, str], Awaitable[dict[str, Any]]]
"""(tool, argument) -> {"ok", "stdout", "error"}."""


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
            if not outcome["ok"]:
                ep.tool_errors += 1
            text = observation_text(outcome["ok"], outcome["stdout"], outcome["error"],
                                    self.limits.max_observation_chars)
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


Turns = ReactTurns | ScriptedTurns


class EpisodeDriver:
    """Runs episodes turn by turn over rollout ranks named by `ranks` (any hashable
    keys: the workflow's are worker ids); `turns` decides what each turn leads to.
    Ranks may leave while it runs (`leave`, a migration): nothing more is routed to
    them, and their turns come back from the ranks that took them over; and join
    (`join`: a wider engine that took over two)."""

    def __init__(self, turns: Turns, ranks: Sequence[Any], submit: Submit, *, affinity: str = "prefer",
                 capacity: int = 256, saturation: float = 0.9, end: Callable[[Any], Awaitable[None]] | None = None
                 ) -> None:
        self.turns_logic, self.submit, self.end = turns, submit, end
        self.affinity = affinity
        self.capacity = capacity
        """Outstanding turns at which a rank counts as full (load 1.0) for routing."""
        self.router = DataRouter(saturation=saturation)
        self.keys = {str(k): k for k in ranks}
        self.outstanding: dict[Any, int] = {k: 0 for k in ranks}
        """Turns out per rank still in the run."""
        self.kv: dict[Any, float] = {k: 0.0 for k in ranks}
        """Per rank: KV utilization as its last result reported it, plus the KV of the turns
        routed to it since (so a burst between two reports does not all land on one rank)."""
        self.kv_capacity: dict[Any, float] = {}
        self.group_home: dict[int, Any] = {}
        """Prompt group -> the rank its first episode started on."""
        self.routed_to: dict[str, Any] = {}
        """Turn id -> the rank it was routed to, until its result is in."""
        self.finished: list[Episode] = []
        self.closed = False
        """Every episode is over and the ranks have their end markers (close)."""
        self.reprefill_tokens = 0
        self.max_wait_s = 0.0
        self.turns = 0
        self.leaving: dict[Any, int] = {}
        """Ranks routed to no more (stop_routing) until they leave."""
        self.live: dict[str, Episode] = {}
        """Episodes started and not over (run)."""
        self.carried: dict[str, list] = {}
        """Episode id -> the KV of its context a leaving rank offered ([tokens, KV or
        its RemoteRef, node, that rank]), sent along with its next turn."""
        self.closing = False
        """Partial rollout: the step has its batch; no turn is routed any more (stop)."""
        self.parked: set[str] = set()
        """Episodes whose next turn (or the rest of the turn they were in) waits for a
        later step."""
        self._wake: asyncio.Queue | None = None

    @property
    def calls_by_tool(self) -> Counter[str]:
        return self.turns_logic.calls_by_tool

    def load(self, key: Any) -> float:
        return min(1.0, max(self.outstanding[key] / self.capacity, self.kv[key]))

    async def route(self, ep: Episode) -> None:
        if self.closing:  # partial rollout: its next turn belongs to a later step
            self.parked.add(ep.id)
            self._poke()
            return
        if not self.outstanding:
            raise RuntimeError("episode driver: no rollout rank left to route to")
        home = self.group_home.get(ep.group) if ep.turns == 0 else None
        if home in self.outstanding:  # a sibling's first turn went there: its prompt is cached
            rank = home
            ep.status.last_worker = str(rank)
            self.router.by_reason["group"] = self.router.by_reason.get("group", 0) + 1
        else:
            loads = {str(k): WorkerState(self.load(k)) for k in self.outstanding}
            rank = self.keys[self.router.distribute(ep.status, loads).worker]
            if ep.turns == 0 and ep.group is not None:
                self.group_home[ep.group] = rank
        rid = f"{ep.id}#{ep.turns}"
        self.outstanding[rank] += 1
        self.routed_to[rid] = rank
        budget = self.turns_logic.budget(ep)
        capacity = self.kv_capacity.get(rank)
        if capacity:
            self.kv[rank] += (len(ep.context) + budget) / capacity
        turn = {"id": rid, "prompt_ids": ep.context, "seed": stable_seed(ep.seed, "turn", ep.turns),
                "tool_count": ep.tool_calls, "max_new_tokens": budget}
        if ep.pending is not None:  # the rest of the turn a closed step cut: its tokens so far go along
            turn["partial"] = ep.pending[:2]
        carried = self.carried.pop(ep.id, None)
        if carried is not None and carried[3] != rank:  # its last turn's rank left: its KV comes along
            turn["kv"], turn["node"] = [carried[:2]], carried[2]  # (the rank it goes to chooses to take it)
        await self.submit(rank, turn)

    def between_turns(self, rank: Any) -> list[Episode]:
        """Live episodes whose last turn `rank` served and whose next turn is not out yet
        (a tool runs): the contexts its prefix cache holds that a next turn will want."""
        home = str(rank)
        return [ep for ep in self.live.values()
                if ep.turns > 0 and ep.status.last_worker == home and f"{ep.id}#{ep.turns}" not in self.routed_to]

    def carry(self, ep: Episode, turn_id: str, offer: list | None, node: Any, rank: Any) -> None:
        """The KV of `ep`'s context, offered by `rank` as it leaves ([tokens, payload]) for
        the turn `turn_id`, goes with that turn, if it is not out yet; None: that rank
        held none."""
        if offer is not None and ep.id in self.live and turn_id == f"{ep.id}#{ep.turns}" \
                and turn_id not in self.routed_to:
            self.carried[ep.id] = [offer[0], offer[1], node, rank]

    def stop_routing(self, ranks: Sequence[Any]) -> None:
        """No turn is routed to `ranks` from now on (they are leaving: `leave` follows)."""
        for key in ranks:
            if key in self.outstanding:
                self.leaving[key] = self.outstanding.pop(key)

    async def leave(self, ranks: Sequence[Any]) -> None:
        """`ranks` leave the run (a migration releases them): no turn is routed to them
        from now on, and each gets its end marker (`end`) behind the turns it has, unless
        the run is closed: then it has it already, and a second one would stay in its
        queue and end that rank's next step before its first turn."""
        for key in ranks:
            if key in self.outstanding or key in self.leaving:
                self.outstanding.pop(key, None)
                self.leaving.pop(key, None)
                if self.end is not None and not self.closed:
                    await self.end(key)

    async def join(self, ranks: Sequence[Any]) -> None:
        """`ranks` join the run (a wider engine started during it): turns are routed to
        them from now on; once the run is closed they get their end marker at once."""
        for key in ranks:
            if self.closed:
                if self.end is not None:
                    await self.end(key)
                continue
            self.keys[str(key)] = key
            self.outstanding.setdefault(key, 0)
            self.kv.setdefault(key, 0.0)

    async def stop(self) -> None:
        """Partial rollout: the step has its batch. No turn is routed from now on (an
        episode that would route one is parked), and every rank gets its end marker;
        the turns the ranks still hold come back by `cut`."""
        self.closing = True
        await self.close()

    def cut(self, turns: list[dict]) -> None:
        """The turns the ranks handed back when the step closed ({"id", "inflight":
        [InflightRequest wire]}, tokens so far and log-probs): each episode waits, its
        turn's tokens kept, made by `version`."""
        for item in turns:
            rid = item["id"]
            ep = self.live.get(rid.rsplit("#", 1)[0])
            routed = self.routed_to.pop(rid, None)
            if routed in self.outstanding:
                self.outstanding[routed] -= 1
            if ep is None:
                continue
            request = item["inflight"][0]
            tokens = list(request["output_token_ids"])
            runs = [list(r) for r in ep.pending[2]] if ep.pending else []  # (cut before: its older runs stay)
            if len(tokens) > (runs[-1][0] if runs else 0):
                runs.append([len(tokens), int(item["version"])])
            ep.pending = [tokens, list(request["output_logprobs"]), runs]
            self.parked.add(ep.id)
        self._poke()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.put_nowait(("check", None))

    def settled(self) -> bool:
        """Closing, and every episode still running waits for a later step."""
        return self.closing and all(ep_id in self.parked for ep_id in self.live)

    async def close(self) -> None:
        """Every episode is over: the ranks still in the run get their end marker (once)."""
        if self.closed:
            return
        self.closed = True
        if self.end is not None:
            for key in [*self.outstanding, *self.leaving]:  # a leaving rank's END is sent once: here, or by leave
                await self.end(key)

    async def on_result(self, ep: Episode, result: dict[str, Any]) -> bool:
        """Takes one finished turn; True when the episode is over."""
        routed = self.routed_to.pop(result["id"], None)
        if routed in self.outstanding:
            self.outstanding[routed] -= 1
        served = result.get("rank", routed)
        if served in self.kv and "kv_utilization" in result:
            self.kv[served] = float(result["kv_utilization"])
            self.kv_capacity[served] = float(result["kv_capacity"])
        if ep.turns > 0 or ep.computed:  # (a resumed episode's context was computed in an earlier step)
            self.reprefill_tokens += max(0, ep.computed - result["cached_tokens"])
        self.turns += 1
        self.max_wait_s = max(self.max_wait_s, result["wait_s"])
        out = list(result["output_ids"])  # (a continued turn's: its tokens from the earlier step too)
        start = len(ep.response)
        if ep.pending is not None:  # the runs an earlier step made, then this one's
            made = ep.pending_segments(start)
            ep.segments += made
            start, ep.pending = (made[-1][1] if made else start), None
        if len(ep.response) + len(out) > start:
            ep.segments.append([start, len(ep.response) + len(out), int(result["version"])])
        ep.response += out
        ep.mask += [1] * len(out)
        ep.logprobs += list(result["logprobs"])
        ep.turns += 1
        ep.version = result["version"]
        ep.computed = len(ep.context)
        ep.status.last_worker = str(served)  # the engine that holds its KV now
        ep.status.cached_prefix = ep.computed
        ep.status.steps = ep.turns
        obs = await self.turns_logic.reply(ep, out, result["finish"])
        ep.status.tool_calls = ep.tool_calls
        if obs is None:
            return True
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
        self.live.update(by_id)
        events: asyncio.Queue = asyncio.Queue()
        self._wake = events

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
            while left and not self.settled():
                kind, value = await events.get()
                if kind == "check":
                    continue
                if kind == "result":
                    tasks.create_task(handle(by_id[value["id"].rsplit("#", 1)[0]], value))
                    continue
                left -= 1
                self.live.pop(value.id, None)
                self.carried.pop(value.id, None)
                self.finished.append(value)
                if on_done is not None:
                    await on_done(value)
            feeder.cancel()  # every episode is over or waits for a later step: no turn result is still coming
