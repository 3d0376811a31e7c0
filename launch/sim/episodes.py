"""Multi-turn episodes on a rollout rank, routed turn by turn (turn_router.py).

An episode is a plain dict that travels between ranks between its turns:

    group, id, prompt_len   its prompt group and sample
    turns                   [[gen_tokens, tool_latency_s, obs_tokens], ...]
    k                       the turn it runs next (or is running)
    context                 token ids so far: the prompt, earlier turns' output and tool output
    generated               tokens it has generated
    affinity                "prefer" or "none" (the policy's, components/placement/agentic.py)
    home, cached_prefix     the engine that ran its last turn, and the context tokens that
                            engine computed (and may still hold in its prefix cache)
    phase                   "gen" (turn k is in this rank's engine) or "tool" (the tool runs)
    tool_until / tool_left  when its tool call ends / what was left of it when exported
    inflight                the InflightRequest of a turn exported part-way (its tokens so far)

A turn's prompt is the whole context, so an engine whose prefix cache still holds the
episode's earlier turns prefills only the tool output. Re-prefill tokens are counted
where they happen, from the engine's own cache hits: of the context tokens that had
been computed before (in full prefix-cache blocks), those the engine had to compute
again (a different engine, or the prefix evicted while the tool ran).
"""
from __future__ import annotations

import asyncio
from typing import Any

from dynarl.components.experience import END
from dynarl.components.rollout.base import InflightRequest

from .group_migration import turn_output_ids
from .turn_router import REQUESTS


def new_episode(group: dict, sample: dict, prompt: list[int], affinity: str) -> dict[str, Any]:
    return {"group": group["index"], "id": sample["id"], "prompt_len": group["prompt_len"],
            "turns": sample["turns"], "k": 0, "context": list(prompt), "generated": 0,
            "affinity": affinity, "home": None, "cached_prefix": 0, "phase": "gen"}


class Episodes:
    """The routed episodes of one rank's generation (one iteration)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.worker = run.w
        self.rank = run.w.worker_id
        self.outbox = run.w.channel(REQUESTS)
        self.live: dict[str, tuple[dict, asyncio.Task]] = {}
        """Episode id -> (episode, its task) while it is on this rank."""
        self.leaving = False
        self.reprefill_tokens = 0
        self.block = run.engine.config.block_size if run.engine.config.enable_prefix_cache else 1

    async def send(self, op: str, **fields: Any) -> None:
        msg = {"op": op, "rank": self.rank, "version": self.run.version, **fields}
        if op in ("route", "done"):
            msg["load"], msg["cap"] = self.run.w.pressure(), float(self.run.engine.capacity)
        await self.outbox.put(msg)
        await self.outbox.flush()

    async def add_group(self, group: dict, prompt: list[int]) -> None:
        """A group taken from "prompts": the router assembles it; its first turns run here."""
        await self.send("group", group=group)
        for s in group["samples"]:
            self.start(new_episode(group, s, prompt, self.worker.affinity))

    def start(self, ep: dict) -> None:
        task = asyncio.ensure_future(self.turn(ep))
        self.live[ep["id"]] = (ep, task)
        self.run.episodes.add(task)
        task.add_done_callback(self.run._episode_done)

    async def serve(self) -> None:
        """Takes the episodes routed to this rank until the router's END."""
        inbox = self.worker.channel("turns")
        while (ep := await inbox.get(key=self.rank)) is not END:
            if self.leaving:  # routed here before the router knew: send it on
                await self.send("route", episode=ep)
            else:
                self.start(ep)

    async def turn(self, ep: dict) -> None:
        """Runs turn k here, then the tool, then hands the episode back to the router."""
        loop = asyncio.get_running_loop()
        scale = self.worker.time_scale
        left = ep.pop("tool_left", 0.0)
        if left > 0:  # exported during its tool call: the tool goes on meanwhile
            ep["phase"], ep["tool_until"] = "tool", loop.time() / scale + left
            await asyncio.sleep(left * scale)
        k = ep["k"]
        gen, latency, obs = ep["turns"][k]
        rid = f"{ep['id']}#{k}"
        ep["phase"], ep["home"] = "gen", self.rank
        inflight = ep.pop("inflight", None)
        if inflight is not None:
            item = InflightRequest.from_wire(inflight)
            known = len(item.request.prompt_token_ids) + len(item.output_token_ids)
            _, cached = await self.run.resume_request(item)
        else:
            known = ep["cached_prefix"]
            _, cached = await self.run.request(rid, ep["context"], gen, tool_count=k)
        self.reprefill_tokens += max(0, known // self.block * self.block - cached)
        ep["generated"] += gen
        self.run.num_tokens += gen
        # the turn's output ids, as the engine made them (a pure function of the request)
        ep["context"] += turn_output_ids(rid, gen, self.worker.vocab)
        if k == len(ep["turns"]) - 1:
            del self.live[ep["id"]]
            self.run.num_samples += 1
            await self.send("done", group=ep["group"], id=ep["id"], gen=ep["generated"], seq=len(ep["context"]))
            return
        ep["cached_prefix"] = len(ep["context"])
        ep["context"] += self.worker.tool_output(rid, obs)
        ep["phase"], ep["tool_until"], ep["k"] = "tool", loop.time() / scale + latency, k + 1
        if latency > 0:
            await asyncio.sleep(latency * scale)  # the tool runs off the device
        del self.live[ep["id"]]
        await self.send("route", episode=ep)

    async def export(self, serve: asyncio.Task) -> None:
        """Released by a migration (the engine is paused, no step in flight): tell the router,
        hand every episode here back to it with its turn's tokens so far or what is left of
        its tool call, and wait for the router's END (episodes routed here meanwhile are
        sent on)."""
        self.leaving = True
        await self.send("leaving")
        for _ in range(100):  # turns whose result is in: let their episodes reach the tool call
            if all(self.run.in_engine(f"{ep['id']}#{ep['k']}") for ep, _ in self.live.values()
                   if ep["phase"] == "gen"):
                break
            await asyncio.sleep(0)
        else:
            raise RuntimeError("episodes did not take their finished turns")
        inflight = {item.request.request_id: item for item in await self.run.engine.export_inflight()}
        now = asyncio.get_running_loop().time() / self.worker.time_scale
        moved = []
        for ep, task in list(self.live.values()):
            task.cancel()
            rid = f"{ep['id']}#{ep['k']}"
            self.run.forget(rid)
            if ep["phase"] == "gen":
                item = inflight.pop(rid, None)
                if item is None:
                    raise RuntimeError(f"turn {rid} is neither in the engine nor finished")
                ep["inflight"] = item.to_wire()
            else:
                ep["tool_left"] = max(0.0, ep["tool_until"] - now)
            moved.append(ep)
        self.live.clear()
        if inflight:
            raise RuntimeError(f"exported requests outside any episode: {sorted(inflight)[:3]}")
        for ep in moved:
            await self.send("route", episode=ep)
        await serve  # drains what was routed here before the router took "leaving"
        self.run.exported += len(moved)
