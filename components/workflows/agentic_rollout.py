"""The rollout rank of the agentic workflow: a RolloutWorker that serves single
turns of multi-turn episodes.

The controller routes each turn to a rank (DataRouter: a follow-up turn prefers
the rank whose prefix cache holds its context) by putting it on channel `get`
under that rank's key. The rank adds it to its engine with the episode's tool
count and its arrival time, so the engine's queue key (FIFO or DynaRL priority,
set by its `queue` init argument) orders its waiting queue, and puts every finished
turn on `put` at once: the episode's next step (a tool call) should not wait for
a chunk. Each result carries the prompt tokens the prefix cache served and how
long the turn waited for admission.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Literal

from dynarl.components.experience import END
from dynarl.components.busy import BusyLog
from dynarl.components.rollout.base import GenerationRequest, InflightRequest, SamplingParams
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.components.rollout.run_control import Run, RunControl, Unfinished
from dynarl.components.rollout.turn import TurnRequest, TurnResult
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.stale_weights import StaleWeights
from dynarl.components.stage_results import RolloutStats
from dynarl.core.migration.workload import Taken
from dynarl.core.priority import PriorityConfig, TurnLengths

log = logging.getLogger(__name__)


class TurnWaits:
    """How long each turn waited in an engine's queue, from its arrival to its
    admission (or to its result, if it finished within the step that admitted it)."""

    def __init__(self) -> None:
        self.queued: dict[str, float] = {}
        """request id -> arrival time, until the engine admits it."""
        self.admitted: dict[str, float] = {}

    def arrived(self, request_id: str, now: float) -> None:
        self.queued[request_id] = now

    def after_step(self, engine: Any, now: float) -> None:
        if self.queued:  # not on every step: most steps admit nothing
            for rid in engine.running_request_ids():  # admitted in this step (or before)
                if rid in self.queued:
                    self.admitted[rid] = now - self.queued.pop(rid)

    def finished(self, request_id: str, now: float) -> float:
        wait = self.admitted.pop(request_id, None)
        return now - self.queued.pop(request_id, now) if wait is None else wait


def turn_result(r: Any, wait_s: float, rank: Any = None, load: Any = None) -> TurnResult:
    """A finished turn as the episode driver takes it: with the rank that served it and
    that engine's KV utilization after the step (the router's load)."""
    return TurnResult(id=r.request_id, output_ids=list(r.output_token_ids), logprobs=list(r.output_logprobs),
                      finish=r.finish_reason, version=r.weight_version, cached_tokens=r.cached_tokens, wait_s=wait_s,
                      rank=rank, kv_utilization=None if load is None else load.utilization,
                      kv_capacity=None if load is None else load.kv_capacity_tokens)


class AgenticRolloutWorker(RolloutWorker):
    def __init__(self, *args: Any, queue: Literal["fifo", "priority"] | None = None,
                 max_bonus_s: float = PriorityConfig().max_bonus_s,
                 **kwargs: Any) -> None:
        """`queue`, `max_bonus_s`: the engine's waiting-queue order (agentic.queue), part of
        the rank's init so a rank started later (a move, a standby pool) has it too;
        None keeps the engine's own."""
        super().__init__(*args, **kwargs)
        self.turn_lengths = TurnLengths()
        """Output tokens of the turns this rank finished, first turns and later ones (the
        priority's check of its assumption; kept across steps)."""
        if queue is not None:
            self.engine.set_queue_key(make_queue_key(queue, PriorityConfig(max_bonus_s=max_bonus_s),
                                                     lengths=self.turn_lengths))
        self.prefix_offers: list[Any] = []
        """KV of finished turns' contexts offered when this rank left a step (RemoteRefs)."""
        self.turn_kv = Taken(0)
        """This step's follow-up turns that came with KV: moved in, or prefilled again."""

    async def offer_prefixes(self, turns: list[list]) -> list:
        """This rank is leaving the step (a migration releases it): for each [turn id,
        context tokens] of an episode whose last turn it served, the KV its engine holds
        for that context, offered for the rank the next turn goes to, as [tokens, KV or
        its RemoteRef] (None: none held). Offers live until this rank serves again."""
        requests = [InflightRequest(GenerationRequest(str(turn_id), list(token_ids), SamplingParams(max_new_tokens=1)),
                                    [], []) for turn_id, token_ids in turns]
        return [await self._offer_kv(request, self.prefix_offers) for request in requests]

    async def _take_turn_kv(self, item: TurnRequest) -> None:
        """A follow-up turn routed away from the rank that served its last turn may carry
        that rank's KV of its context: moved in where that is the cheaper choice
        (kv_choice), before the turn is queued, so its admission finds it cached."""
        across = self._across(item.node)
        try:
            blocks = await self._kv_in(item.kv or [], across, await self.engine.load(), self.turn_kv, item.id)
            await self._install(blocks, across, self.turn_kv)
        except Exception as exc:  # not needed for correctness: the turn prefills its context
            log.warning("rollout rank %d: the KV of turn %s could not be taken in, prefilling: %r",
                        self.rank, item.id, exc)
            self.turn_kv.reprefilled += 1

    async def serve_turns(self, get: str, put: str, key: Any, version: int, sampling: dict[str, Any]) -> RolloutStats:
        """TurnRequests from `get` (under `key`) until END; each result goes to `put` at once. Returns
        counters and the engine's busy intervals. While it runs the rank takes part in
        Workload migration as a generate() does (RolloutWorker's workload_* methods):
        released, it exports its turns with their tokens so far once it has its END."""
        if self.engine.weight_version != version:
            raise StaleWeights(f"rollout holds weights v{self.engine.weight_version}, "
                                           f"the step needs v{version}")
        self._withdraw(self.prefix_offers)  # a step that left this rank is over: its next turns went elsewhere
        self.turn_kv = Taken(0)
        run = self.run = _TurnServe(self.engine, self.channel(put), key, sampling, self.time_scale,
                                    self._take_turn_kv, self.turn_lengths)
        self.admitting = False  # its work is the turns the driver routes to it, not the prompt channel
        load = await self.engine.load()
        preempted, reprefilled = load.num_preemptions, load.reprefill_tokens
        fetch = run.fetch_task = asyncio.ensure_future(run.fetch(self.channel(get)))
        try:
            await run.serve(fetch)
        except BaseException:
            run.control.finish()
            raise
        finally:
            fetch.cancel()
            self.tokens_done += run.num_tokens
            self.run = None
        try:
            await run.outbox.flush()
            load, kv = await self.engine.load(), self.turn_kv
            return dataclasses.replace(
                run.stats, tokens=run.num_tokens, busy=run.busy.intervals, devices=load.devices,
                turns_exported=run.num_exported, turns_imported=run.num_imported,
                preemptions=load.num_preemptions - preempted, reprefill_tokens=load.reprefill_tokens - reprefilled,
                turn_kv_requests=kv.kv_requests, turn_kv_tokens=kv.kv_tokens, turn_kv_s=kv.kv_s / self.time_scale,
                turn_kv_reprefilled=kv.reprefilled)
        finally:
            run.control.finish()

    @property
    def time_scale(self) -> float:
        """Loop seconds per engine second: an emulated engine's (priority windows and
        waits are in engine seconds), 1 for real engines."""
        return float(getattr(getattr(self.engine, "config", None), "time_scale", 1.0) or 1.0)


class _TurnServe(Run):
    """One step's turn serving on one rank; a Run (rollout/run_control.py), as a
    generate()'s Generation is."""

    def __init__(self, engine: Any, outbox: Any, key: Any, sampling: dict[str, Any], time_scale: float,
                 take_kv: Any = None, lengths: TurnLengths | None = None) -> None:
        """`take_kv`: takes in the KV a turn carries (its item's "kv"), before it is queued;
        `lengths`: told each finished turn's tool count and output tokens."""
        self.engine, self.outbox, self.key, self.sampling = engine, outbox, key, sampling
        self.take_kv, self.lengths = take_kv, lengths
        self.tool_counts: dict[str, int] = {}
        """Turn id -> its episode's tool calls so far, until the turn finishes."""
        self.time_scale = time_scale
        self.waits = TurnWaits()
        self.busy = BusyLog()
        self.stats = RolloutStats()
        """Its counters (turns, cached_tokens, engine_steps, max_wait_s); serve_turns adds the rest."""
        self.num_tokens = self.num_finished = self.finished_tokens = 0
        self.num_exported = self.num_imported = 0
        self.control = RunControl()

    def now(self) -> float:
        return asyncio.get_running_loop().time() / self.time_scale

    async def fetch(self, inbox: Any) -> None:
        while (item := await inbox.get(self.key)) is not END:
            if item.kv and self.take_kv is not None:
                await self.take_kv(item)
            now = self.now()
            request = GenerationRequest(
                item.id, list(item.prompt_ids),
                SamplingParams(**(self.sampling | {"max_new_tokens": item.max_new_tokens}), seed=item.seed),
                tool_count=item.tool_count, arrival_time=now)
            partial = item.partial
            if partial:  # the rest of a turn an earlier step's close cut: it continues from its tokens
                self.num_tokens -= len(partial[0])  # made in an earlier step
                self.engine.import_inflight([InflightRequest(request, list(partial[0]), list(partial[1]))])
            else:
                self.engine.add_request(request)
            self.tool_counts[item.id] = int(item.tool_count)
            self.waits.arrived(item.id, now)
            self.control.arrived.set()

    async def serve(self, fetch: asyncio.Future) -> None:
        loop, c = asyncio.get_running_loop(), self.control
        try:
            while True:
                if fetch.done() and not fetch.cancelled() and (error := fetch.exception()) is not None:
                    raise error
                if c.paused:
                    await self._results(await self.engine.step())  # paused: only results already complete
                    c.at_boundary.set()  # between engine steps: safe to export
                    if c.handed_off and not c.held:
                        return  # exported and committed
                    await c.wait()
                    continue
                if not self.engine.has_work():
                    if fetch.done() and not c.held:
                        return
                    await c.wait(fetch)
                    continue
                begun = loop.time()
                results = await self.engine.step()
                self.busy.add(begun, loop.time())
                self.stats.engine_steps += 1
                self.waits.after_step(self.engine, self.now())
                await self._results(results)
                await asyncio.sleep(0)  # lets fetch add turns that arrived meanwhile
        finally:
            c.go("close")

    async def _results(self, results: list) -> None:
        results = [r for r in results if r.finish_reason != "abort"]  # aborted: exported, finished elsewhere
        if not results:
            return
        now, load = self.now(), await self.engine.load()
        for r in results:
            tool_count = self.tool_counts.pop(r.request_id, None)
            if tool_count is not None and self.lengths is not None:
                self.lengths.observe(tool_count, len(r.output_token_ids))
            wait = self.waits.finished(r.request_id, now)
            c = self.stats
            c.turns += 1
            c.cached_tokens += r.cached_tokens
            c.max_wait_s = max(c.max_wait_s, wait)
            self.num_tokens += len(r.output_token_ids)
            self.num_finished += 1
            self.finished_tokens += len(r.output_token_ids)
            await self.outbox.put(turn_result(r, wait, self.key, load))

    # --- Workload migration (RolloutWorker's workload_* methods call these) ---------
    async def export(self) -> list[Unfinished]:
        """Every turn here (queued or running) with its tokens so far, once this rank has
        its END (the driver routes nothing more here): one item per turn."""
        self.control.check("export")
        if self.fetch_task is not None:
            await asyncio.wait([self.fetch_task])
        items = []
        for item in await self.engine.export_inflight():
            self.waits.finished(item.request.request_id, self.now())
            self.num_tokens += len(item.output_token_ids)  # generated here
            items.append(Unfinished(id=item.request.request_id, weight=float(max(len(item.output_token_ids), 1)),
                                    inflight=[item]))
        self.num_exported = len(items)
        self.control.go("export")
        self.control.arrived.set()
        return items

    def adopt(self, items: list[Unfinished]) -> None:
        """Takes turns over from a released rank (or back, from a rolled-back migration)."""
        self.control.go("adopt")
        now = self.now()
        inflight = [r for item in items for r in item.inflight]
        for r in inflight:
            self.num_tokens -= len(r.output_token_ids)  # counted by the rank that generated them
            self.waits.arrived(r.request.request_id, now)
            self.tool_counts[r.request.request_id] = r.request.tool_count
        self.engine.import_inflight(inflight)
        self.num_imported += len(items)
        self.control.arrived.set()
