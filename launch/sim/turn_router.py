"""The rollout group's DataRouter for multi-turn episodes, on the controller side.

An episode's first turn runs on the engine that took its prompt group from
"prompts". After each tool call the episode comes back here ("turn-requests") and
core/data_router.py's DataRouter picks the engine of its next turn, from the
episode's affinity (`prefer`: back to the engine holding its prefix, unless that
engine is gone or saturated; `none`: the least loaded) and the engines' loads; the
episode goes out on "turns", keyed by that engine's worker id.

Loads are what each engine reported with its last message (max of KV utilization
and requests held / max_num_seqs), plus the KV of the episodes routed to it since,
so a burst of turns between two reports does not all land on one engine.

Groups are assembled here: a finished episode reports its lengths, and a group
whose episodes are all done goes to "rollouts" (chunks of `chunk_size`), as the
rollout ranks do for single-turn groups.

Messages from rollout ranks (plain dicts, msgpack-safe; each also carries the
iteration's weight `version`, and the router drops other iterations' messages):
    {"op": "group", "rank", "group"}        a prompt group taken from "prompts"
    {"op": "route", "rank", "load", "cap", "episode"}   ready for its next turn
    {"op": "done", "rank", "load", "cap", "group", "id", "gen", "seq"}
    {"op": "fetched_end", "rank"}            the rank took its END from "prompts"
    {"op": "leaving", "rank"}                released by a migration: route nothing
                                             more to it (it gets its END at once)
The router ends when every rank still in the group has taken its END and no episode
is open; then each rank gets END on "turns" and ends its generation.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.experience import END
from dynarl.core.data_router import DataRouter, ItemStatus, WorkerState

REQUESTS, TURNS = "turn-requests", "turns"
CAPACITY = 1 << 20
"""Every episode of an iteration fits: puts never wait (the ranks drain "turns" at once)."""


@dataclass(slots=True)
class RouterStats:
    routed: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    predicted_reprefill_tokens: int = 0


class TurnRouter:
    def __init__(self, ctl: Any, ranks: list[str], chunk_size: int, version: int, saturation: float = 0.9) -> None:
        self.version = version
        self.inbox = ctl.channel(REQUESTS, capacity=CAPACITY)
        self.turns = ctl.channel(TURNS, capacity=CAPACITY)
        self.rollouts = ctl.channel("rollouts")
        self.live = list(ranks)
        self.gone: set[str] = set()
        self.chunk_size = chunk_size
        self.router = DataRouter(saturation=saturation)
        self.load: dict[str, float] = {r: 0.0 for r in ranks}
        self.groups: dict[int, dict] = {}
        self.left: dict[int, int] = {}
        """Group index -> its episodes not done yet."""
        self.fetched_end: set[str] = set()
        self.ready: list[dict] = []

    def finished(self) -> bool:
        return not self.left and all(r in self.fetched_end for r in self.live)

    async def run(self) -> RouterStats:
        while not self.finished():
            await self.handle(await self.inbox.get())
        if self.ready:
            await self._emit()
        for rank in self.live:
            await self.turns.put(END, key=rank)
        r = self.router
        return RouterStats(r.routed, dict(r.by_reason), r.reprefill_tokens)

    async def handle(self, msg: dict) -> None:
        op, rank = msg["op"], msg["rank"]
        if msg["version"] != self.version:
            return  # from an iteration without a router (no multi-turn group): nothing waits on it
        if "load" in msg and rank in self.load:
            self.load[rank] = float(msg["load"])
        if op == "group":
            group = msg["group"]
            self.groups[group["index"]] = group
            self.left[group["index"]] = len(group["samples"])
        elif op == "route":
            await self.route(msg["episode"], msg["cap"])
        elif op == "done":
            await self.done(msg)
        elif op == "fetched_end":
            self.fetched_end.add(rank)
        elif op == "leaving":
            if rank in self.live:
                self.live.remove(rank)
                self.gone.add(rank)
                await self.turns.put(END, key=rank)  # after everything routed to it so far
        else:
            raise ValueError(f"turn router: unknown op {op!r}")

    async def route(self, episode: dict, capacity: float) -> None:
        if not self.live:
            raise RuntimeError("turn router: no rollout engine left to route to")
        workers = {r: WorkerState(min(1.0, self.load[r]), alive=r not in self.gone) for r in self.load}
        status = ItemStatus(affinity=episode["affinity"], last_worker=episode["home"],
                            steps=episode["k"], tool_calls=episode["k"], cached_prefix=episode["cached_prefix"])
        target = self.router.distribute(status, workers).worker
        self.load[target] += (len(episode["context"]) + episode["turns"][episode["k"]][0]) / max(capacity, 1.0)
        await self.turns.put(episode, key=target)

    async def done(self, msg: dict) -> None:
        index = msg["group"]
        group = self.groups[index]
        for s in group["samples"]:
            if s["id"] == msg["id"]:
                if "gen" in s:
                    raise RuntimeError(f"episode {msg['id']} finished twice")
                s["gen"], s["seq"] = msg["gen"], msg["seq"]
                break
        else:
            raise RuntimeError(f"episode {msg['id']} is not in group {index}")
        self.left[index] -= 1
        if self.left[index] == 0:
            del self.left[index]
            self.ready.append(self.groups.pop(index))
            if len(self.ready) >= self.chunk_size:
                await self._emit()

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.rollouts.put(chunk, weight=len(chunk))


def start_turn_router(ctl: Any, rollout_group: Any, batch: list, chunk_size: int,
                      version: int) -> asyncio.Future | None:
    """The iteration's router task when its batch has a multi-turn group; None otherwise.
    (Rollout ranks route only when configured with an affinity: agentic workloads.)"""
    if not any(s.is_multi_turn for group in batch for s in group.samples):
        return None
    ranks = [h.spec.worker_id for h in rollout_group.handles]
    return asyncio.ensure_future(TurnRouter(ctl, ranks, chunk_size, version).run())
