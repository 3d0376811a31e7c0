"""SimRolloutWorker: one rollout engine instance (TP devices) of the simulated cluster.

The same job as components/rollout/worker.py (prompt groups in from a channel,
finished groups out in chunks, continuous batching in between), on an
EmulatedRolloutEngine: time comes from the cost model, lengths from the workload.
A rank stands for one engine; its spec device is the engine's first device and
it covers `tp` consecutive devices.

Single-turn samples become one request of exactly `len` tokens. A multi-turn
sample is an episode: each turn's prompt is the context so far (prompt, earlier
turns' output and tool output), so the engine's prefix cache serves the previous
turns; between turns the tool runs for its latency, off the device.
"""
from __future__ import annotations

import asyncio
import zlib
from typing import Any

import dynarl
from dynarl.components.experience import END
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.rollout.emulated.tokens import response_tokens

from .switching import add_busy, half_switch


class SimRolloutWorker(dynarl.Worker):
    def __init__(self, engine: dict, shares_device: bool = False) -> None:
        self.engine = EmulatedRolloutEngine(EmulatedRolloutConfig(**engine))
        self.shares_device = shares_device
        self.time_scale = self.engine.config.time_scale
        self.vocab = self.engine.model.vocab_size
        self.run: _Run | None = None
        """The iteration's generation in progress (None between generate() calls)."""

    async def onload(self) -> None:
        await half_switch(self.shares_device, self.time_scale)
        self.engine.resume_memory()

    async def offload(self) -> None:
        await half_switch(self.shares_device, self.time_scale)
        if self.shares_device:
            self.engine.release_memory()

    def receive_weights(self, version: int, num_bytes: int) -> int:
        """The transfer is charged to the engine's next step (EmulatedRolloutEngine)."""
        self.engine.update_weights(num_bytes, version)
        return version

    def load(self) -> dict[str, float]:
        """KV utilization (the donor signal), requests held, the output tokens those have
        made so far, and the mean length of the requests finished this iteration (what
        the scheduler's remaining-work estimate uses: no oracle lengths)."""
        load = self.engine.load()
        sched = self.engine.scheduler
        generated = sum(s.num_output(sched.step) for s in sched.running.values()) + sum(
            s.out_base for s in sched.waiting.values())
        run = self.run
        return {"utilization": load.utilization, "running": load.num_running, "waiting": load.num_waiting,
                "generated": generated, "kv": load.active_kv_tokens, "capacity": load.kv_capacity_tokens,
                "finished": run.num_finished if run else 0,
                "finished_tokens": run.finished_tokens if run else 0,
                "active_run": run is not None and not run.closed}

    # --- Workload migration (core/migration/workload.py's protocol) -------------------

    def workload_pause(self) -> None:
        self.engine.pause()

    async def workload_export(self) -> list[dict]:
        """Hands over every unfinished prompt group with its requests' tokens so far.
        Only once this rank has fetched its END (the scheduler shrinks rollout only
        when the prompt channel is drained), and only single-turn samples."""
        run = self.run
        if run is None or run.closed:
            return []
        return await run.export()

    def workload_load(self) -> float:
        run = self.run
        if run is None or run.closed:
            return float("inf")  # a finished rank takes no work
        load = self.load()
        return float(load["generated"] + load["running"] + load["waiting"])

    def workload_import(self, items: list[dict]) -> int:
        if not items:
            return 0
        run = self.run
        if run is None or run.closed:
            raise RuntimeError("workload_import on a rollout rank whose generation has ended")
        run.import_groups(items)
        return len(items)

    def workload_resume(self) -> None:
        self.engine.resume()

    async def generate(self, get: str, put: str, *, version: int, chunk_size: int = 1) -> dict[str, Any]:
        """Consumes prompt groups from `get` until END; puts finished groups on `put` in
        chunks of `chunk_size`. Returns counters and the engine's busy intervals."""
        if self.engine.weight_version != version:
            raise RuntimeError(f"rollout holds weights v{self.engine.weight_version}, the step needs v{version}")
        run = self.run = _Run(self, self.channel(put), chunk_size)
        fetch = run.fetch_task = asyncio.ensure_future(run.fetch(self.channel(get)))
        try:
            await run.drive(fetch)
        finally:
            run.closed = True
            fetch.cancel()
        return {"groups": run.num_groups, "tokens": run.num_tokens, "busy": run.busy, "tp": self.engine.config.tp,
                "preemptions": self.engine.scheduler.num_preemptions, "samples": run.num_samples,
                "exported_groups": run.exported, "imported_groups": run.imported}


class _Run:
    """One iteration's generation on one engine."""

    def __init__(self, worker: SimRolloutWorker, outbox: Any, chunk_size: int) -> None:
        self.w, self.engine, self.outbox, self.chunk_size = worker, worker.engine, outbox, chunk_size
        self.waiting: dict[str, asyncio.Future] = {}
        self.episodes: set[asyncio.Task] = set()
        self.ready: list[dict] = []
        self.wake = asyncio.Event()
        self.busy: list[list[float]] = []
        self.num_groups = self.num_tokens = 0
        self.num_samples = self.num_finished = self.finished_tokens = 0
        self.exported = self.imported = 0
        self.open: dict[int, tuple[dict, asyncio.Task]] = {}
        """Prompt groups not yet emitted: index -> (group, its task)."""
        self.closed = False
        self.stepping = False
        self.step_done = asyncio.Event()
        self.fetch_task: asyncio.Future | None = None

    async def fetch(self, inbox: Any) -> None:
        while (group := await inbox.get()) is not END:
            self.num_groups += 1
            self._start(group, self.group(group))

    def _start(self, group: dict, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self.open[group["index"]] = (group, task)
        self.episodes.add(task)
        task.add_done_callback(self._episode_done)

    def _episode_done(self, task: asyncio.Task) -> None:
        self.episodes.discard(task)
        self.wake.set()

    async def drive(self, fetch: asyncio.Future) -> None:
        loop = asyncio.get_running_loop()
        while not (fetch.done() and not self.episodes):
            for task in [fetch, *self.episodes]:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            if not self.engine.has_work():
                self.wake.clear()
                waiter = asyncio.ensure_future(self.wake.wait())
                # woken by a new request, a finished episode, or (until it ends) the fetch
                await asyncio.wait([waiter] if fetch.done() else [fetch, waiter], return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                continue
            start = loop.time()
            self.stepping = True
            try:
                results = await self.engine.step()
            finally:
                self.stepping = False
                self.step_done.set()
            add_busy(self.busy, start, loop.time())
            for result in results:
                if result.finish_reason == "abort":
                    continue  # exported: another engine finishes it
                self.num_finished += 1
                self.finished_tokens += len(result.output_token_ids)
                self.waiting.pop(result.request_id).set_result(len(result.output_token_ids))
            await asyncio.sleep(0)  # let fetch and episodes add requests between steps
        fetch.result()
        if self.ready:
            await self._emit()
        await self.outbox.flush()

    async def request(self, rid: str, prompt: list[int], tokens: int) -> int:
        future = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        self.engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=tokens)))
        self.wake.set()
        return await future

    async def group(self, group: dict) -> None:
        prompt = token_ids(group["prompt"], group["prompt_len"], self.w.vocab)
        await asyncio.gather(*(self.sample(s, prompt) for s in group["samples"]))
        await self._finish(group)

    async def _finish(self, group: dict) -> None:
        self.open.pop(group["index"], None)
        self.num_samples += len(group["samples"])
        self.ready.append(group)
        if len(self.ready) >= self.chunk_size:
            await self._emit()

    async def export(self) -> list[dict]:
        """Workload migration, the released side: wait for the fetch to have taken END
        and for the step in flight (the engine is paused), then take every unfinished
        group out with its requests' tokens so far."""
        if self.fetch_task is not None:
            await asyncio.wait([self.fetch_task])
        while self.stepping:  # (an Event, not sleep(0): virtual time advances only when the loop is idle)
            self.step_done.clear()
            await self.step_done.wait()
        for _ in range(3):  # let the groups whose last sample just finished emit
            await asyncio.sleep(0)
        inflight = {item.request.request_id: item for item in self.engine.export_inflight()}
        items = []
        for index, (group, task) in list(self.open.items()):
            if any("turns" in s for s in group["samples"]):
                raise RuntimeError("workload migration of multi-turn episodes is not modelled")
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
        s["gen"] = await future
        s["seq"] = prompt_len + s["gen"]
        self.num_tokens += s["gen"]

    async def sample(self, s: dict, prompt: list[int]) -> None:
        if "turns" not in s:
            s["gen"] = await self.request(s["id"], prompt, s["len"])
            s["seq"] = len(prompt) + s["gen"]
            self.num_tokens += s["gen"]
            return
        context, generated = list(prompt), 0
        for k, (gen, latency, obs) in enumerate(s["turns"]):
            rid = f"{s['id']}#{k}"
            await self.request(rid, context, gen)
            generated += gen
            # the turn's output ids, as the engine made them (a pure function of the request)
            context += response_tokens(zlib.crc32(rid.encode()), 0, gen, gen, self.w.vocab)
            if latency > 0:
                await asyncio.sleep(latency * self.w.time_scale)  # the tool runs off the device
            context += token_ids(rid, obs, self.w.vocab) if obs else []
        s["gen"], s["seq"] = generated, len(context)
        self.num_tokens += generated

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.outbox.put(chunk, weight=len(chunk))


def token_ids(key: str, length: int, vocab: int) -> list[int]:
    """Deterministic synthetic ids for a prompt or a tool output named `key`."""
    return response_tokens(zlib.crc32(key.encode()) ^ 0x7F4A7C15, 0, length, length, vocab)
