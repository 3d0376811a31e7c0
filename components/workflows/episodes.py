"""Multi-turn episodes: the state of one, and the driver that runs many at once.

One episode is a ReAct loop over a rollout engine and the tools:

    turn = generate(context)                  routed: a follow-up turn prefers the engine
    reply = parse_turn(turn)                  holding its prefix (DataRouter, `prefer`)
    Call      -> run the tool, append the observation (mask 0), next turn
    Malformed -> append a short error observation (mask 0), next turn; counted
    Answer    -> done; so is the turn cap or the context budget

`next_action` is the pure decision (episode.py, with the Episode); `EpisodeDriver`
is the thin async loop around it, written against a callable that submits a turn to
a rank and a `turns` strategy (turns.py: ReactTurns parses the model's text and calls
the tools; ScriptedTurns plays a simulated workload's script, for `dynarl sim`;
AgentTurns follows an agent's requests on the OpenAI endpoint), so the
training workflow, the simulator and `dynarl bench agentic` (engines in process)
run the very same episode logic. Re-prefill is measured, not modelled:
context the previous turn's engine had computed minus the prompt tokens the
serving engine's prefix cache supplied.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any, Awaitable, Callable, Sequence

from dynarl.components.rollout.run_control import Unfinished
from dynarl.components.rollout.turn import TurnRequest, TurnResult
from dynarl.components.tasks.problem import stable_seed
from dynarl.components.workflows.episode import Episode, EpisodeState, Limits, next_action
from dynarl.components.workflows.turns import ReactTurns, ScriptedTurns, Turns
from dynarl.core.data_router import DataRouter, WorkerState

__all__ = ["Episode", "EpisodeDriver", "EpisodeState", "Limits", "ReactTurns", "ScriptedTurns", "next_action"]

Submit = Callable[[Any, TurnRequest], Awaitable[None]]
"""(rank key, turn request) -> queued on that rank."""


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
        turn = TurnRequest(id=rid, prompt_ids=ep.context, seed=stable_seed(ep.seed, "turn", ep.turns),
                           tool_count=self.turns_logic.tool_count(ep), max_new_tokens=budget)
        if ep.pending is not None:  # the rest of the turn a closed step cut: its tokens so far go along
            turn.partial = ep.pending[:2]
        carried = self.carried.pop(ep.id, None)
        if carried is not None and carried[3] != rank:  # its last turn's rank left: its KV comes along
            turn.kv, turn.node = [carried[:2]], carried[2]  # (the rank it goes to chooses to take it)
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

    def cut(self, turns: list[Unfinished]) -> None:
        """The turns the ranks handed back when the step closed (RolloutWorker.partial_close:
        tokens so far and log-probs): each episode waits, its turn's tokens kept, made by
        the item's version."""
        for item in turns:
            rid = item.id
            ep = self.live.get(rid.rsplit("#", 1)[0])
            routed = self.routed_to.pop(rid, None)
            if routed in self.outstanding:
                self.outstanding[routed] -= 1
            if ep is None:
                continue
            request = item.inflight[0]
            tokens = list(request.output_token_ids)
            runs = [list(r) for r in ep.pending[2]] if ep.pending else []  # (cut before: its older runs stay)
            if len(tokens) > (runs[-1][0] if runs else 0):
                runs.append([len(tokens), item.version])
            ep.pending = [tokens, list(request.output_logprobs), runs]
            self.parked.add(ep.id)
        self._poke()

    def add(self, ep: Episode) -> None:
        """Another episode joins the running `run` (an agent's retry of a failed one)."""
        if self._wake is None:
            raise RuntimeError("episode driver: add needs a running run")
        self._wake.put_nowait(("add", ep))

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

    async def on_result(self, ep: Episode, result: TurnResult) -> bool:
        """Takes one finished turn; True when the episode is over."""
        routed = self.routed_to.pop(result.id, None)
        if routed in self.outstanding:
            self.outstanding[routed] -= 1
        served = routed if result.rank is None else result.rank
        if served in self.kv and result.kv_utilization is not None and result.kv_capacity is not None:
            self.kv[served] = float(result.kv_utilization)
            self.kv_capacity[served] = float(result.kv_capacity)
        if ep.turns > 0 or ep.computed:  # (a resumed episode's context was computed in an earlier step)
            self.reprefill_tokens += max(0, ep.computed - result.cached_tokens)
        self.turns += 1
        self.max_wait_s = max(self.max_wait_s, result.wait_s)
        out = list(result.output_ids)  # (a continued turn's: its tokens from the earlier step too)
        start = len(ep.response)
        if ep.pending is not None:  # the runs an earlier step made, then this one's
            made = ep.pending_segments(start)
            ep.segments += made
            start, ep.pending = (made[-1][1] if made else start), None
        if len(ep.response) + len(out) > start:
            ep.segments.append([start, len(ep.response) + len(out), int(result.version)])
        ep.response += out
        ep.mask += [1] * len(out)
        ep.logprobs += list(result.logprobs)
        ep.turns += 1
        ep.version = result.version
        ep.computed = len(ep.context)
        ep.status.last_worker = str(served)  # the engine that holds its KV now
        ep.status.cached_prefix = ep.computed
        ep.status.steps = ep.turns
        obs = await self.turns_logic.reply(ep, out, result.finish)
        ep.status.tool_calls = self.turns_logic.tool_count(ep)
        if obs is None:
            return True
        ep.response += obs
        ep.mask += [0] * len(obs)
        ep.logprobs += [0.0] * len(obs)
        await self.route(ep)
        return False

    async def run(self, episodes: list[Episode], results: Callable[[], Awaitable[TurnResult]],
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

        async def handle(ep: Episode, result: TurnResult) -> None:
            if await self.on_result(ep, result):
                await events.put(("done", ep))

        async def begin(ep: Episode) -> None:  # (an agent's episode: once its first request is in)
            if await self.turns_logic.begin(ep):  # type: ignore[union-attr]
                await self.route(ep)
            else:
                await events.put(("done", ep))

        waits = hasattr(self.turns_logic, "begin")
        if not waits:
            for ep in episodes:
                await self.route(ep)
        left = len(episodes)
        async with asyncio.TaskGroup() as tasks:
            feeder = tasks.create_task(pump())
            for ep in episodes if waits else ():
                tasks.create_task(begin(ep))
            while left and not self.settled():
                kind, value = await events.get()
                if kind == "check":
                    continue
                if kind == "add":  # (an agent's retry: a fresh episode for the same sample)
                    by_id[value.id] = self.live[value.id] = value
                    value.status.affinity = self.affinity  # type: ignore[assignment]
                    left += 1
                    tasks.create_task(begin(value) if waits else self.route(value))
                    continue
                if kind == "result":
                    tasks.create_task(handle(by_id[value.id.rsplit("#", 1)[0]], value))
                    continue
                left -= 1
                self.live.pop(value.id, None)
                self.carried.pop(value.id, None)
                self.finished.append(value)
                if on_done is not None:
                    await on_done(value)
            feeder.cancel()  # every episode is over or waits for a later step: no turn result is still coming
