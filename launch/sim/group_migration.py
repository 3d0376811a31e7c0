"""Workload migration of single-turn prompt groups between simulated rollout engines
(the part of launch/sim/rollout_worker.py's _Run that moves groups): the released engine
exports each unfinished group with its requests' tokens so far; the kept engine imports
them and continues (its emulation re-prefills those tokens). Multi-turn episodes move
through the turn router instead (episodes.py)."""
from __future__ import annotations

import asyncio
import zlib

from dynarl.components.rollout.base import InflightRequest
from dynarl.components.rollout.emulated.tokens import response_tokens


class GroupMigration:
    """Mixed into rollout_worker._Run, whose state (engine, open, waiting, ...) it uses."""

    async def export_groups(self) -> list[dict]:
        """Workload migration, the released side (single-turn groups; the engine is paused
        and no step is in flight): every unfinished group with its requests' tokens so far."""
        for _ in range(3):  # let the groups whose last sample just finished emit
            await asyncio.sleep(0)
        inflight = {item.request.request_id: item for item in await self.engine.export_inflight()}
        items = []
        for index, (group, task) in list(self.open.items()):
            if any("turns" in s for s in group["samples"]):
                raise RuntimeError("multi-turn episodes migrate only when routed (a worker with an affinity)")
            task.cancel()
            self.open.pop(index)
            parts, weight = [], 0.0
            for s in group["samples"]:
                if "gen" in s:
                    continue
                self.waiting.pop(s["id"], None)
                item = inflight.pop(s["id"], None)
                if item is not None:
                    parts.append(item.to_wire())
                    weight += max(len(item.output_token_ids), 1)
                else:
                    weight += 1.0
            items.append({"id": index, "weight": weight, "group": group, "inflight": parts})
        if inflight:
            raise RuntimeError(f"exported requests outside any open group: {sorted(inflight)[:3]}")
        self.exported += len(items)
        self.wake.set()
        return items

    def import_groups(self, items: list[dict]) -> None:
        """Workload migration, the kept side: continue each group's requests here."""
        moved: list[InflightRequest] = []
        for item in items:
            group = item["group"]
            parts = {d["request"]["request_id"]: InflightRequest.from_wire(d) for d in item["inflight"]}
            moved.extend(parts.values())
            loop = asyncio.get_running_loop()
            futures = {}
            for s in group["samples"]:
                if "gen" not in s and s["id"] in parts:
                    futures[s["id"]] = self.waiting[s["id"]] = loop.create_future()
            self._start(group, self._resumed(group, futures))
        self.engine.import_inflight(moved)
        self.imported += len(items)
        self.wake.set()

    async def _resumed(self, group: dict, futures: dict[str, asyncio.Future]) -> None:
        prompt = token_ids(group["prompt"], group["prompt_len"], self.w.vocab)
        pending = []
        for s in group["samples"]:
            if "gen" in s:
                continue
            pending.append(self._imported(s, group["prompt_len"], futures[s["id"]]) if s["id"] in futures
                           else self.sample(s, prompt))
        await asyncio.gather(*pending)
        await self._finish(group)

    async def _imported(self, s: dict, prompt_len: int, future: asyncio.Future) -> None:
        s["gen"] = (await future)[0]
        s["seq"] = prompt_len + s["gen"]
        self.num_tokens += s["gen"]


def turn_output_ids(rid: str, gen: int, vocab: int) -> list[int]:
    """The ids the emulated engine generates for request `rid` of `gen` tokens (its
    seed without a sampling seed, components/rollout/emulated/tokens.py request_seed):
    a follow-up turn's context must hold exactly what the engine produced."""
    return response_tokens(zlib.crc32(rid.encode()), 0, gen, gen, vocab)


def token_ids(key: str, length: int, vocab: int) -> list[int]:
    """Deterministic synthetic ids for a prompt or a tool output named `key`."""
    return response_tokens(zlib.crc32(key.encode()) ^ 0x7F4A7C15, 0, length, length, vocab)
