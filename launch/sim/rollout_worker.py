"""SimRolloutWorker: one rollout engine instance (TP devices) of the simulated cluster.

The same job as components/rollout/worker.py (prompt groups in from a channel,
finished groups out in chunks, continuous batching in between), on an
EmulatedRolloutEngine: time comes from the cost model, lengths from the workload.
A rank stands for one engine; its spec device is the engine's first device and
it covers `tp` consecutive devices.

Single-turn samples become one request of exactly `len` tokens. A multi-turn
sample is an episode: each turn's prompt is the context so far (prompt, earlier
turns' output and tool output), so the engine's prefix cache serves the previous
turns; between turns the tool runs for its latency, off the device. With an
`affinity` (the policy's, scenario.for_policy) episodes are routed turn by turn by
the iteration's DataRouter (turn_router.py, episodes.py) and take part in Workload
migration; without one (the profiler) an episode stays on the engine that took it.
The engine's queue order ("fifo" / "priority") is its config's `queue`.
"""
from __future__ import annotations

import asyncio
from typing import Any

import dynarl
from dynarl.components.experience import END
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine

from .episodes import Episodes
from .group_migration import GroupMigration, token_ids, turn_output_ids
from .switching import add_busy


class SimRolloutWorker(dynarl.Worker):
    def __init__(self, engine: dict, shares_device: bool = False) -> None:
        engine = dict(engine)
        self.affinity: str | None = engine.pop("affinity", None)
        """Multi-turn routing: "prefer" / "none" (turn_router.py); None keeps episodes here."""
        if self.affinity not in (None, "prefer", "none"):
            raise ValueError(f"affinity must be 'prefer' or 'none', got {self.affinity!r}")
        self.engine = EmulatedRolloutEngine(EmulatedRolloutConfig(**engine))
        self.shares_device = shares_device
        self.time_scale = self.engine.config.time_scale
        self.vocab = self.engine.model.vocab_size
        self.run: _Run | None = None
        """The iteration's generation in progress (None between generate() calls)."""

    @property
    def worker_id(self) -> str:
        return self._runtime.spec.worker_id

    def pressure(self) -> float:
        """The DataRouter's load: KV utilization or requests held / max_num_seqs, the larger."""
        load = self.engine.load_now()
        held = (load.num_running + load.num_waiting) / self.engine.config.max_num_seqs
        return max(load.utilization, held)

    def tool_output(self, rid: str, obs: int) -> list[int]:
        return token_ids(rid, obs, self.vocab) if obs else []

    async def onload(self) -> None:
        if self.shares_device:  # half a role switch each way (the engine spends it)
            await self.engine.resume_memory()

    async def offload(self) -> None:
        if self.shares_device:
            await self.engine.release_memory()

    async def receive_weights(self, version: int, num_bytes: int) -> int:
        """The transfer is charged to the engine's next step (EmulatedRolloutEngine)."""
        await self.engine.update_weights(num_bytes, version)
        return version

    def load(self) -> dict[str, float]:
        """KV utilization (the donor signal), requests held, the output tokens those have
        made so far, and the mean length of the requests finished this iteration (what
        the scheduler's remaining-work estimate uses: no oracle lengths)."""
        load = self.engine.load_now()
        generated = load.generated_tokens
        run = self.run
        return {"utilization": load.utilization, "running": load.num_running, "waiting": load.num_waiting,
                "generated": generated, "kv": load.active_kv_tokens, "capacity": load.kv_capacity_tokens,
                "finished": run.num_finished if run else 0,
                "finished_tokens": run.finished_tokens if run else 0,
                "active_run": run is not None and not run.closed}

    # --- Workload migration (core/migration/workload.py's protocol) -------------------

    async def workload_pause(self) -> None:
        await self.engine.pause()

    async def workload_export(self) -> list[dict]:
        """Hands over every unfinished prompt group with its requests' tokens so far, once
        this rank has fetched its END (the scheduler shrinks rollout only when the prompt
        channel is drained). Routed multi-turn episodes go back to the turn router instead
        (each with its turn's tokens so far, or what is left of its tool call): no items."""
        run = self.run
        if run is None or run.closed:
            return []
        items = await run.export()
        run.hold = True  # open until the migration commits (or gives the items back)
        return items

    def workload_commit(self) -> None:
        """The kept ranks have the exported work: this rank's run may end."""
        run = self.run
        if run is not None and not run.closed:
            run.hold = False
            run.wake.set()

    def workload_load(self) -> float:
        run = self.run
        if run is None or run.closed:
            return float("inf")  # a finished rank takes no work
        run.hold = True  # a kept rank: its generate() waits for the import before it may return
        load = self.load()
        return float(load["generated"] + load["running"] + load["waiting"])

    def workload_import(self, items: list[dict]) -> int:
        run = self.run
        if run is not None:
            run.hold = False
            run.wake.set()
        if not items:
            return 0
        if run is None or run.closed:
            raise RuntimeError("workload_import on a rollout rank whose generation has ended")
        run.import_groups(items)
        return len(items)

    async def workload_resume(self) -> None:
        """A rolled-back migration: the engine steps again, and the run's driver, which
        waited while the engine was paused, is woken to drive it (the groups given back
        were imported before the resume)."""
        await self.engine.resume()
        if self.run is not None:
            self.run.wake.set()

    async def generate(self, get: str, put: str, *, version: int, chunk_size: int = 1) -> dict[str, Any]:
        """Consumes prompt groups from `get` until END; puts finished groups on `put` in
        chunks of `chunk_size`. Returns counters and the engine's busy intervals."""
        if self.engine.weight_version != version:
            raise RuntimeError(f"rollout holds weights v{self.engine.weight_version}, the step needs v{version}")
        run = self.run = _Run(self, self.channel(put), chunk_size, version)
        preempted_before = self.engine.scheduler.num_preemptions  # the engine's count is cumulative
        fetch = run.fetch_task = asyncio.ensure_future(run.fetch(self.channel(get)))
        try:
            await run.drive(fetch)
        finally:
            run.closed = True
            fetch.cancel()
        return {"groups": run.num_groups, "tokens": run.num_tokens, "busy": run.busy, "tp": self.engine.config.tp,
                "preemptions": self.engine.scheduler.num_preemptions - preempted_before, "samples": run.num_samples,
                "exported_groups": run.exported, "imported_groups": run.imported,
                "reprefill_tokens": run.reprefill_tokens}


class _Run(GroupMigration):
    """One iteration's generation on one engine."""

    def __init__(self, worker: SimRolloutWorker, outbox: Any, chunk_size: int, version: int = 0) -> None:
        self.w, self.engine, self.outbox, self.chunk_size = worker, worker.engine, outbox, chunk_size
        self.version = version
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
        self.hold = False
        """Set while a Workload migration may still import into this run (workload_load
        asked it as a kept rank): it does not end before the import, even if idle."""
        self.stepping = False
        self.step_done = asyncio.Event()
        self.fetch_task: asyncio.Future | None = None
        self.routed = Episodes(self) if worker.affinity is not None else None
        self.serve_task: asyncio.Future | None = None

    @property
    def reprefill_tokens(self) -> int:
        return self.routed.reprefill_tokens if self.routed else 0

    async def fetch(self, inbox: Any) -> None:
        while (group := await inbox.get()) is not END:
            self.num_groups += 1
            if self.routed is not None and any("turns" in s for s in group["samples"]):
                await self.routed.add_group(group, token_ids(group["prompt"], group["prompt_len"], self.w.vocab))
            else:
                self._start(group, self.group(group))
        if self.routed is not None:
            await self.routed.send("fetched_end")

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
        serve = self.serve_task = asyncio.ensure_future(self.routed.serve()) if self.routed else None
        try:
            await self._drive(fetch, serve, loop)
        finally:
            if serve is not None:
                serve.cancel()

    async def _drive(self, fetch: asyncio.Future, serve: asyncio.Future | None, loop: Any) -> None:
        inputs = [fetch] + ([serve] if serve is not None else [])
        while self.hold or not (all(t.done() for t in inputs) and not self.episodes):
            for task in [*inputs, *self.episodes]:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            if not self.engine.has_work():
                self.wake.clear()
                waiter = asyncio.ensure_future(self.wake.wait())
                # woken by a new request, a finished episode, or (until they end) the inputs
                await asyncio.wait([waiter, *(t for t in inputs if not t.done())],
                                   return_when=asyncio.FIRST_COMPLETED)
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
                self.waiting.pop(result.request_id).set_result((len(result.output_token_ids), result.cached_tokens))
            await asyncio.sleep(0)  # let fetch and episodes add requests between steps
        for task in inputs:
            task.result()
        if self.ready:
            await self._emit()
        await self.outbox.flush()

    async def request(self, rid: str, prompt: list[int], tokens: int, tool_count: int = 0) -> tuple[int, int]:
        """(output tokens, prompt tokens the prefix cache served). arrival_time is run time
        in emulated seconds: the priority window (core/priority.py) is in those."""
        future = asyncio.get_running_loop().create_future()
        self.waiting[rid] = future
        arrival = asyncio.get_running_loop().time() / self.w.time_scale
        self.engine.add_request(GenerationRequest(rid, prompt, SamplingParams(max_new_tokens=tokens),
                                                  tool_count=tool_count, arrival_time=arrival))
        self.wake.set()
        return await future

    async def resume_request(self, item: InflightRequest) -> tuple[int, int]:
        """A turn exported part-way by another engine: continue it here."""
        future = asyncio.get_running_loop().create_future()
        self.waiting[item.request.request_id] = future
        self.engine.import_inflight([item])
        self.wake.set()
        return await future

    def in_engine(self, rid: str) -> bool:
        """The request is queued or running here (not finished, not exported)."""
        sched = self.engine.scheduler
        return rid in sched.running or rid in sched.waiting

    def forget(self, rid: str) -> None:
        self.waiting.pop(rid, None)

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
        if self.routed is not None:  # multi-turn: the episodes go back to the router (episodes.py)
            if self.open:  # (agentic traces and workloads have no single-turn groups)
                raise RuntimeError("single-turn groups beside routed episodes are not migrated")
            await self.routed.export(self.serve_task)
            self.wake.set()
            return []
        return await self.export_groups()

    async def sample(self, s: dict, prompt: list[int]) -> None:
        if "turns" not in s:
            s["gen"] = (await self.request(s["id"], prompt, s["len"]))[0]
            s["seq"] = len(prompt) + s["gen"]
            self.num_tokens += s["gen"]
            return
        context, generated = list(prompt), 0
        for k, (gen, latency, obs) in enumerate(s["turns"]):
            rid = f"{s['id']}#{k}"
            await self.request(rid, context, gen, tool_count=k)
            generated += gen
            # the turn's output ids, as the engine made them (a pure function of the request)
            context += turn_output_ids(rid, gen, self.w.vocab)
            if latency > 0:
                await asyncio.sleep(latency * self.w.time_scale)  # the tool runs off the device
            context += self.w.tool_output(rid, obs)
        s["gen"], s["seq"] = generated, len(context)
        self.num_tokens += generated

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.outbox.put(chunk, weight=len(chunk))

