"""One step's generation on one rollout rank (RolloutWorker.generate): fetch prompt
groups, step the engine, emit finished groups in chunks. A Run (run_control.py): a
Workload migration exports its unfinished groups and adopts others' while it runs."""
from __future__ import annotations

import asyncio
from typing import Any

from dynarl.components.busy import BusyLog
from dynarl.components.experience import END, PromptGroup, made_of
from dynarl.components.rollout.base import (GenerationRequest, GenerationResult, InflightRequest,
                                            RolloutEngine, SamplingParams)
from dynarl.components.rollout.run_control import Run, RunControl, Unfinished


class Generation(Run):
    """One step's generation on one rank: fetch prompts, step the engine, emit chunks."""

    def __init__(self, engine: RolloutEngine, outbox: Any, chunk_size: int, sampling: dict) -> None:
        self.engine = engine
        self.outbox = outbox
        self.chunk_size = chunk_size
        self.sampling = sampling
        self.pending: dict[str, tuple[PromptGroup, int]] = {}
        """request id -> (its group, its sample index)."""
        self.left: dict[int, int] = {}
        """group index -> samples still generating."""
        self.groups_by_index: dict[int, PromptGroup] = {}
        self.ready: list[PromptGroup] = []
        self.busy = BusyLog()
        """When the engine stepped (loop time)."""
        self.control = RunControl()
        self.num_groups = self.num_tokens = self.num_steps = 0
        self.num_exported = self.num_imported = 0
        self.num_finished = self.finished_tokens = 0
        """Requests finished here this step, and their output tokens."""
        self.inbox: Any = None
        """The channel the prompts come from (fetch)."""

    def mean_step_s(self) -> float:
        return self.busy.seconds / self.num_steps if self.num_steps else 0.0

    async def export(self) -> list[Unfinished]:
        """Whole groups that still have samples generating here (see RolloutWorker)."""
        self.control.check("export")
        inflight = {i.request.request_id: i for i in await self.engine.export_inflight()}
        # One that finished while being taken out (a real engine's abort races its last
        # token) is a result of step(): recorded first, so each group's count holds.
        while self.engine.has_work():
            for result in await self.engine.step():
                self._record(result)
        by_group: dict[int, list[InflightRequest]] = {}
        for rid, item in inflight.items():
            group, _ = self.pending.pop(rid)
            by_group.setdefault(group.index, []).append(item)
        items = []
        for index, requests in sorted(by_group.items()):
            group = self.groups_by_index[index]
            if self.left.pop(index) != len(requests):
                raise RuntimeError(f"group {index}: bookkeeping disagrees with the engine's requests")
            self.num_tokens += sum(len(r.output_token_ids) for r in requests)  # generated here
            weight = float(sum(max(len(r.output_token_ids), 1) for r in requests))  # as workload_load's
            items.append(Unfinished(id=f"group/{index}", weight=weight, inflight=requests, group=group))
        self.num_exported = len(items)
        self.control.go("export")
        self.control.arrived.set()
        return items

    def adopt(self, items: list[Unfinished]) -> None:
        """Takes whole groups over from a released rank (or back, on this released
        rank, from a migration rolled back): this rank completes and emits them, from
        the KV that came with them where it did (its prefix cache serves it:
        RolloutWorker.workload_import put it there)."""
        self.control.go("adopt")
        requests = []
        for item in items:
            group = item.group
            index_of = {s.id: k for k, s in enumerate(group.samples)}
            for r in item.inflight:
                self.pending[r.request.request_id] = (group, index_of[r.request.request_id])
                self.num_tokens -= len(r.output_token_ids)  # counted by the rank that generated them
            self.left[group.index] = len(item.inflight)
            self.groups_by_index[group.index] = group
            requests += item.inflight
        self.engine.import_inflight(requests)
        self.num_imported += len(items)
        self.control.arrived.set()

    async def fetch(self, inbox: Any, first_trip: int = 1) -> None:
        """Until END: the rank is handed no more prompts when it returns. The first round
        trip asks for `first_trip` groups (the rank's share of the step), each later one
        for one: ranks that are through their share take what is left a group at a time,
        and none takes two shares because its second trip came before another's first."""
        self.inbox = inbox
        inbox.prefetch = first_trip
        while (group := await inbox.get()) is not END:
            inbox.prefetch = 1
            left = 0
            for k, sample in enumerate(group.samples):
                if sample.finish:  # partial rollout: done in an earlier step
                    continue
                # a sample may carry its own length (a simulated workload's: the emulated
                # engine makes exactly max_new_tokens)
                sampling = self.sampling if sample.max_new_tokens is None else \
                    {**self.sampling, "max_new_tokens": sample.max_new_tokens}
                request = GenerationRequest(sample.id, list(group.prompt_ids),
                                            SamplingParams(**sampling, seed=sample.seed))
                self.pending[sample.id] = (group, k)
                left += 1
                if sample.partial:  # partial rollout: continues from its tokens so far
                    self.num_tokens -= len(sample.output_ids)  # made in an earlier step
                    self.engine.import_inflight([InflightRequest(request, list(sample.output_ids),
                                                                 list(sample.logprobs))])
                else:
                    self.engine.add_request(request)
            self.left[group.index] = left
            if not left:
                self.ready.append(group)
            self.groups_by_index[group.index] = group
            self.num_groups += 1
            self.control.arrived.set()

    async def drive(self, fetch: asyncio.Future) -> None:
        c = self.control
        try:
            while True:
                await self._drive(fetch)
                fetch.result()
                if self.ready:
                    await self._emit()
                await self.outbox.flush()
                if c.handed_off and c.held:  # exported: the migration's commit or give-back comes next
                    await c.wait()
                    continue
                # Decide and close with no await in between: a migration's workload_load
                # either came before (held: go on, the import follows) or sees it closed.
                if c.handed_off or not (c.paused or c.held or self.engine.has_work()):
                    return
        finally:
            c.go("close")

    async def _drive(self, fetch: asyncio.Future) -> None:
        loop, c = asyncio.get_running_loop(), self.control
        while c.paused or c.held or not (fetch.done() and not self.engine.has_work()):
            if fetch.done() and fetch.exception() is not None:
                raise fetch.exception()
            if c.paused:
                for result in await self.engine.step():  # paused: only results already complete
                    await self._finished(result)
                c.at_boundary.set()  # between engine steps: safe to export
                if c.handed_off:
                    break
                await c.wait()
                continue
            if not self.engine.has_work():
                await c.wait(fetch)
                continue
            begun = loop.time()
            results = await self.engine.step()
            self.busy.add(begun, loop.time())
            for result in results:
                await self._finished(result)
            self.num_steps += 1
            await asyncio.sleep(0)  # lets fetch add newly arrived prompts between steps

    async def _finished(self, result: GenerationResult) -> None:
        if self._record(result) and len(self.ready) >= self.chunk_size:
            await self._emit()

    def _record(self, result: GenerationResult) -> bool:
        """The sample finished; True if that finished its group (now ready)."""
        group, k = self.pending.pop(result.request_id)
        sample = group.samples[k]
        sample.finished(result.output_token_ids, result.output_logprobs, result.finish_reason, result.weight_version)
        self.num_tokens += len(result.output_token_ids)
        self.num_finished += 1
        self.finished_tokens += len(result.output_token_ids)  # whole samples: the scheduler's lengths
        self.left[group.index] -= 1
        if self.left[group.index]:
            return False
        self.ready.append(group)
        return True

    async def _emit(self) -> None:
        chunk, self.ready = self.ready, []
        await self.outbox.put(chunk, weight=len(chunk), **made_of(self.inbox, chunk))

