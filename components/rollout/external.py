"""The books of a rollout engine over an out-of-process engine (SGLang, vLLM): each
request it hands on is a task on the rollout worker's loop that ends with the request's
GenerationResult, and exactly one caller gets that result: the generate() call that
made it, an abort() or export_inflight() call that collected it, or step().

The engine-specific parts are the subclass's: how a request runs (`_run`), its result
when it ends here before reaching the engine (`_local_result`), a new entry
(`_entry`), aborting requests inside the engine until each is back (`_abort_inside`),
whether requests are being served now (`_serving`) and when the gate that keeps
requests from the engine is open (`_update_gate`).

Export takes every request out, its tokens so far kept; if it fails part-way, each
request goes back in with its tokens once its result is in (one that finished meanwhile
is a result of step()), so nothing is lost or delivered twice.
"""
from __future__ import annotations

import abc
import asyncio
import functools
from typing import Any, Sequence

from dynarl.components.rollout.base import GenerationRequest, GenerationResult, InflightRequest


class ExternalEngine(abc.ABC):
    steps_on_loop = False

    weight_version: int

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {}   # request_id -> the subclass's Entry
        self._futures: dict[str, asyncio.Future] = {}
        self._watched: set[str] = set()   # ids a generate() call returns itself
        self._claimed: set[str] = set()   # ids an abort()/export_inflight() call collects
        self._finished: list[GenerationResult] = []
        self._errors: list[BaseException] = []
        self._paused = self._exporting = False
        self._gate = asyncio.Event()
        self._gate.set()
        self._progress = asyncio.Event()  # wakes step()
        self._cache_hit_tokens = 0

    # -- the subclass's ---------------------------------------------------------------
    @abc.abstractmethod
    def _entry(self, request: GenerationRequest, prior_ids: list[int] | None = None,
               prior_logprobs: list[float] | None = None) -> Any:
        ...

    @abc.abstractmethod
    async def _run(self, entry: Any) -> GenerationResult:
        ...

    @abc.abstractmethod
    def _local_result(self, entry: Any, reason: str) -> GenerationResult:
        ...

    @abc.abstractmethod
    async def _abort_inside(self, entries: list[Any], everything: bool) -> None:
        """Abort `entries` (all handed to the engine) until each one's result is in.
        `everything`: they are all the engine has (export)."""
        ...

    def _serving(self) -> bool:
        return self._gate.is_set()

    @abc.abstractmethod
    def _update_gate(self) -> None:
        ...

    # -- requests ---------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        self._add(self._entry(request))

    def import_inflight(self, items: Sequence[InflightRequest]) -> None:
        """Continue requests exported by another engine: the engine gets prompt + tokens
        so far and generates the remaining max_new_tokens; the result counts the
        imported tokens as output."""
        if len({item.request.request_id for item in items}) != len(items):
            raise ValueError("request ids in one import_inflight() call must be unique")
        for item in items:
            if len(item.output_token_ids) != len(item.output_logprobs):
                raise ValueError(f"request {item.request.request_id}: {len(item.output_token_ids)} tokens but "
                                 f"{len(item.output_logprobs)} logprobs")
        for item in items:
            self._add(self._entry(item.request, list(item.output_token_ids), list(item.output_logprobs)))

    def _add(self, entry: Any) -> None:
        rid = entry.request.request_id
        if rid in self._entries:
            raise ValueError(f"request_id {rid!r} is already in this engine")
        loop = asyncio.get_running_loop()
        self._futures[rid] = loop.create_future()
        reason = finished_before_start(entry)
        if reason is not None:  # imported already complete: nothing for the engine to do
            self._deliver(entry, self._local_result(entry, reason))
            return
        self._entries[rid] = entry
        entry.task = loop.create_task(self._run(entry))
        entry.task.add_done_callback(functools.partial(self._on_done, entry))

    def _on_done(self, entry: Any, task: asyncio.Task) -> None:
        if task.cancelled():
            return  # cancelled before the engine saw it; whoever cancelled delivered the result
        rid = entry.request.request_id
        if (error := task.exception()) is not None:
            self._entries.pop(rid, None)
            future = self._futures.pop(rid)
            if rid in self._watched or rid in self._claimed:
                future.set_exception(error)  # raised by generate()/abort()/export
            else:
                future.cancel()
                self._errors.append(error)  # raised by step()
                self._progress.set()
            return
        result = task.result()
        self._cache_hit_tokens += result.cached_tokens
        self._deliver(entry, result)

    def _deliver(self, entry: Any, result: GenerationResult) -> None:
        rid = entry.request.request_id
        self._entries.pop(rid, None)
        self._futures.pop(rid).set_result(result)
        if rid not in self._watched and rid not in self._claimed:
            self._finished.append(result)
        self._progress.set()

    def has_work(self) -> bool:
        return bool(self._finished or self._errors or (self._entries and self._serving()))

    async def step(self) -> list[GenerationResult]:
        """Results of requests that finished since the last step; waits for one if none
        has. Raises the error of a request the engine refused."""
        if not (self._finished or self._errors):
            if self._entries and self._serving():
                self._progress.clear()
                await self._progress.wait()  # a result, an error, or a pause/resume
            else:
                await asyncio.sleep(0)
        if self._errors:
            raise self._errors.pop(0)
        results, self._finished = self._finished, []
        return results

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Add the requests and return their results in the order given. A request
        exported meanwhile comes back as its partial output with finish_reason 'abort'."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids in one generate() call must be unique")
        self._watched.update(ids)
        try:
            futures = []
            for request in requests:
                self.add_request(request)
                futures.append(self._futures[request.request_id])
            return list(await asyncio.gather(*futures))
        finally:
            self._watched.difference_update(ids)

    def running_request_ids(self) -> list[str]:
        """Requests handed to the engine (past the gate); a queued one counts as running here."""
        return [rid for rid, e in self._entries.items() if e.submitted]

    def _cancel_all(self) -> None:
        for entry in self._entries.values():
            entry.task.cancel()

    # -- taking requests out ------------------------------------------------------------
    async def _end(self, entries: list[Any], everything: bool) -> None:
        """Every entry ends with its partial result: one not yet handed to the engine here
        and now, the others by the engine's abort."""
        inside = []
        for entry in entries:
            if entry.submitted:
                inside.append(entry)
            else:
                entry.task.cancel()
                self._deliver(entry, self._local_result(entry, "abort"))
        if inside:
            await self._abort_inside(inside, everything)

    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        """Abort the given requests (unknown ids are ignored); returns their partial
        results (finish_reason 'abort', the tokens so far)."""
        targets = [self._entries[rid] for rid in request_ids if rid in self._entries]
        futures = [self._futures[e.request.request_id] for e in targets]
        self._claimed.update(e.request.request_id for e in targets)
        try:
            await self._end(targets, everything=False)
            return list(await asyncio.gather(*futures))
        finally:
            self._claimed.difference_update(e.request.request_id for e in targets)

    async def export_inflight(self) -> list[InflightRequest]:
        """Take every unfinished request out: prompt + tokens so far, for another engine's
        import_inflight(). The engine's requests are aborted; one that finished meanwhile
        stays a normal result of step()."""
        entries = list(self._entries.values())
        ids = [e.request.request_id for e in entries]
        futures = {rid: self._futures[rid] for rid in ids}
        self._claimed.update(ids)
        self._exporting = True
        self._update_gate()
        try:
            await self._end(entries, everything=True)
            results = [futures[e.request.request_id].result() for e in entries]  # raises before any is taken
            exported = []
            for entry, result in zip(entries, results):
                if result.finish_reason == "abort":
                    exported.append(InflightRequest(entry.request, result.output_token_ids, result.output_logprobs))
                elif entry.request.request_id not in self._watched:
                    self._finished.append(result)
            return exported
        except BaseException:
            # Some may be aborted already (the engine answers now or later): each goes back
            # in with its tokens so far once its result is in, one that finished is a
            # result of step(); until then it stays claimed, so no abort result reaches step().
            kept = [e for e in entries if e.request.request_id not in self._watched]
            for entry in kept:
                futures[entry.request.request_id].add_done_callback(functools.partial(self._take_back, entry))
            ids = [rid for rid in ids if rid in self._watched]
            raise
        finally:
            self._claimed.difference_update(ids)
            self._exporting = False
            self._update_gate()

    def _take_back(self, entry: Any, future: asyncio.Future) -> None:
        """After a failed export: `entry`'s result is in; an abort continues here."""
        self._claimed.discard(entry.request.request_id)
        if future.cancelled():
            return
        if (error := future.exception()) is not None:
            self._errors.append(error)
        elif (result := future.result()).finish_reason == "abort":
            self._add(self._entry(entry.request, list(result.output_token_ids), list(result.output_logprobs)))
        else:
            self._finished.append(result)
        self._progress.set()


def finished_before_start(entry: Any) -> str | None:
    """'stop' or 'length' when the imported tokens already complete the request."""
    if entry.prior_ids and entry.prior_ids[-1] in entry.request.sampling.stop_token_ids:
        return "stop"
    if entry.remaining() <= 0:
        return "length"
    return None
