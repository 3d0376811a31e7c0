"""The SGLang rollout engine: dynarl's RolloutEngine over one `sglang.Engine`, driven
from the rollout worker's own event loop.

SGLang's Engine runs its schedulers in other processes and its TokenizerManager in
ours; every Engine method except async_generate calls loop.run_until_complete and
fails inside a running loop (docs/BACKENDS.md A1). So this adapter awaits
`engine.async_generate` and the TokenizerManager's coroutines, and every method that
talks to SGLang is a coroutine here: load, abort, pause, resume, export_inflight,
update_weights (also _in_buckets, _from_payloads), release_memory, resume_memory, as the
RolloutEngine protocol has them (rollout/base.py). add_request, import_inflight,
has_work, running_request_ids and set_queue_key stay synchronous (they only start tasks).

Requests pass a gate of ours before reaching SGLang: closed while paused, released
or exporting. SGLang parks a request that arrives while it is paused in the
TokenizerManager, where abort cannot reach it (it would run after continue); the
gate keeps ours out of that state. The gate check and SGLang's own pause check run
in one step of the loop (nothing in between awaits), so no pause slips between them.
"""
from __future__ import annotations

import asyncio
import importlib
import os
import shutil
from collections.abc import Mapping
from typing import Any, Callable, Iterable, Sequence

from dynarl.components.extras import require_extra
from dynarl.components.trainer.base import bucket_by_bytes
from dynarl.components.rollout.base import EngineLoad, GenerationRequest, GenerationResult, InflightRequest, QueueKey
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.external import ExternalEngine, finished_before_start
from dynarl.components.rollout.sglang.requests import (Entry, RidAllocator, continue_after, generate_kwargs,
                                                       local_result, remaining_tokens, result_from_output,
                                                       stopped_off_list)
from dynarl.components.rollout.sglang.weights import (BucketEncoder, NamedTensors, encode_buckets,
                                                      flattened_bucket_encoder, push_payloads)

IDLE_WAIT_S = 60.0
"""How long release_memory waits for SGLang's scheduler to go idle."""


class SGLangRolloutEngine(ExternalEngine):
    def __init__(self, engine: Any, config: SGLangConfig, weight_version: int = 0, *,
                 encode_bucket: BucketEncoder = flattened_bucket_encoder,
                 priority_of: Callable[[GenerationRequest], int] = lambda r: r.tool_count,
                 owned_dir: str | None = None) -> None:
        """`engine`: a started sglang.Engine. `owned_dir`: a model folder made for this
        engine, removed at shutdown."""
        super().__init__()
        self.engine, self.tm, self.config = engine, engine.tokenizer_manager, config
        self.io = importlib.import_module("sglang.srt.managers.io_struct")
        self.weight_version = weight_version
        self._encode, self._priority_of = encode_bucket, priority_of
        self._queue_key: QueueKey | None = None
        self._rids = RidAllocator()
        self._released: set[str] = set()
        self._owned_dir = owned_dir

    @classmethod
    def start(cls, config: SGLangConfig, weight_version: int = 0,
              owned_dir: str | None = None) -> "SGLangRolloutEngine":
        """Launch SGLang (its scheduler processes; on a CPU when server_args' device is
        "cpu", which needs SGLang's CPU kernels, sgl-kernel built from source). Call
        inside the worker's running loop: the TokenizerManager binds to the loop it
        first runs on."""
        require_extra("sglang", "rollout.backend")
        kwargs = config.engine_kwargs()
        if kwargs.get("device") == "cpu":
            os.environ["SGLANG_USE_CPU_ENGINE"] = "1"  # else SGLang's RoPE imports vllm's CUDA ops
        import sglang

        return cls(sglang.Engine(**kwargs), config, weight_version, owned_dir=owned_dir)

    def shutdown(self) -> None:
        self._cancel_all()
        try:
            self.engine.shutdown()
        finally:
            if self._owned_dir:
                shutil.rmtree(self._owned_dir, ignore_errors=True)

    # -- requests (the books: ExternalEngine) -----------------------------------------
    def _entry(self, request: GenerationRequest, prior_ids: list[int] | None = None,
               prior_logprobs: list[float] | None = None) -> Entry:
        """SGLang gets prompt + tokens so far as its input (an imported request's prior)."""
        return Entry(request, self._rids.next(), prior_ids or [], prior_logprobs or [])

    def _local_result(self, entry: Entry, reason: str) -> GenerationResult:
        return local_result(entry, reason, self.weight_version)

    async def _run(self, entry: Entry) -> GenerationResult:
        while True:
            await self._gate.wait()
            entry.submitted = True  # no await between here and SGLang's pause check
            out = await self.engine.async_generate(**generate_kwargs(entry, self._priority(entry.request)))
            result = result_from_output(entry, out, self.weight_version)
            if not stopped_off_list(entry, result):
                return result
            # SGLang stops on the model's EOS as well as on the listed ids: go on from
            # here under a new rid, as an imported request would (nothing awaits
            # between the result and the next submit unless the gate is closed)
            entry.submitted = False
            continue_after(entry, result)
            entry.rid = self._rids.next()
            if (reason := finished_before_start(entry)) is not None:
                return local_result(entry, reason, self.weight_version)

    def _priority(self, request: GenerationRequest) -> int | None:
        if self._queue_key is None or not self.config.enable_priority_scheduling:
            return None
        return int(self._priority_of(request))

    # -- control --------------------------------------------------------------------
    async def load(self) -> EngineLoad:
        """Live KV and queue load from SGLang's load snapshots (one per DP rank):
        num_used_tokens excludes evictable prefix-cache tokens, so it is the active KV."""
        snapshots = await self.tm.get_loads()
        parked = sum(1 for e in self._entries.values() if not e.submitted)
        # Requests are not streamed back: tokens made so far are known only for the
        # imported part of a request (what another engine had made before the move).
        generated = sum(len(e.prior_ids) for e in self._entries.values())
        running = sum(s.num_running_reqs for s in snapshots)
        waiting = sum(s.num_waiting_reqs for s in snapshots)
        active = sum(s.num_used_tokens for s in snapshots)
        if self._paused:
            # SGLang publishes no snapshot while paused: the last one is from before the
            # pause. Its retract put every request back in the queue and freed their KV.
            running, waiting, active = 0, len(self._entries) - parked, 0
        return EngineLoad(active_kv_tokens=active,
                          kv_capacity_tokens=sum(s.max_total_num_tokens for s in snapshots),
                          num_running=running,
                          num_waiting=waiting + parked,
                          cache_hit_tokens=self._cache_hit_tokens, generated_tokens=generated,
                          budget_tokens=sum(remaining_tokens(e) for e in self._entries.values()),
                          devices=self.config.tp_size)

    async def _abort_inside(self, entries: list[Entry], everything: bool) -> None:
        """abort_request is synchronous; each result comes back through async_generate.
        `everything` (export): abort-all, repeated until every request is back (one still
        being tokenized can miss an abort, as in SGLang's own pause)."""
        futures = [self._futures[e.request.request_id] for e in entries]
        if not everything:
            for entry in entries:
                self.tm.abort_request(rid=entry.rid)
            await asyncio.wait(futures)
            return
        while not all(f.done() for f in futures):
            self.tm.abort_request(abort_all=True)
            await asyncio.wait([f for f in futures if not f.done()], timeout=self.config.abort_retry_s)

    async def pause(self) -> None:
        """Stop generating: running requests go back to SGLang's queue and free their KV
        (mode "retract"); they recompute after resume(). New requests wait at our gate."""
        if self._paused:
            return
        self._paused = True
        self._update_gate()  # first, so nothing new reaches SGLang's pause check
        await self.tm.pause_generation(self.io.PauseGenerationReqInput(mode="retract"))

    async def resume(self) -> None:
        if not self._paused:
            return
        await self.tm.continue_generation(self.io.ContinueGenerationReqInput())
        self._paused = False
        self._update_gate()

    async def export_inflight(self) -> list[InflightRequest]:
        """Take every unfinished request out (ExternalEngine.export_inflight).

        "So far" is what SGLang has reported: a running request's abort carries all its
        tokens, but a queued one (after pause(), which retracts) carries only those a
        non-streaming request already reported, every SGLANG_FORCE_STREAM_INTERVAL (50)
        tokens. The importing engine regenerates the rest: still a correct continuation,
        up to that many tokens of work lost. Export before pausing to keep them."""
        return await super().export_inflight()

    async def export_kv(self, item: InflightRequest) -> None:
        """SGLang exports no KV: a moved request is re-prefilled where it goes."""
        return None

    def import_kv(self, kv: Any, across_nodes: bool = False) -> int:
        return 0

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """named_tensors: (HF name, tensor) pairs or a mapping, any subset of the model;
        sent in buckets of config.weight_bucket_bytes. See update_weights_in_buckets."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        await self.update_weights_in_buckets(bucket_by_bytes(items, self.config.weight_bucket_bytes), version)

    async def update_weights_in_buckets(self, buckets: Iterable[NamedTensors], version: int) -> None:
        """Pause (unless paused), push every bucket, flush the prefix cache, resume (if we
        paused). Requests in flight keep their place and recompute with the new weights.
        With weights released (release_memory), resume_memory(["weights"]) first."""
        await self.update_weights_from_payloads(encode_buckets(buckets, self.config.tp_size, self._encode), version)

    async def update_weights_from_payloads(self, payloads: Iterable[tuple[list[Any], str | None]],
                                           version: int) -> None:
        """The same, for buckets encoded elsewhere (the trainer process owns the tensors):
        each item is (one payload per TP rank, load_format), see weights.encode_buckets."""
        if "weights" in self._released:
            raise RuntimeError("weights are released; resume_memory(['weights']) before updating them")
        was_paused = self._paused
        await self.pause()
        try:
            await push_payloads(self.tm, self.io, payloads, version)
            self.weight_version = version
        finally:
            if not was_paused:
                await self.resume()

    async def release_memory(self, tags: Sequence[str] | None = None) -> None:
        """Free GPU memory (device_lock): the given tags, or config.offload_tags. SGLang
        asserts it is idle, which a retract-paused engine is; otherwise abort or export
        requests first. Unpaused, it first waits for SGLang's scheduler to go idle (a
        flush): the batch that finished the last request stays its last batch, not idle,
        until its loop turns once more, and the assertion would kill the scheduler."""
        in_sglang = sum(1 for e in self._entries.values() if e.submitted)
        if in_sglang and not self._paused:
            raise RuntimeError(f"release_memory with {in_sglang} requests in SGLang; pause(), abort or "
                               "export them first")
        tags = list(tags) if tags is not None else list(self.config.offload_tags)
        new = set(tags) - self._released
        self._released.update(tags)
        self._update_gate()  # first, so nothing new reaches SGLang while it releases
        try:
            if not self._paused:
                flushed = await self.tm.flush_cache(timeout_s=IDLE_WAIT_S)
                if not flushed.success:
                    raise RuntimeError(f"SGLang did not go idle within {IDLE_WAIT_S} s before releasing memory: "
                                       f"{flushed.message}")
            await self.tm.release_memory_occupation(self.io.ReleaseMemoryOccupationReqInput(tags=tags), None)
        except BaseException:  # SGLang kept its memory: so does this engine (and its gate reopens)
            self._released.difference_update(new)
            self._update_gate()
            raise

    async def resume_memory(self, tags: Sequence[str] | None = None) -> None:
        """Re-allocate memory; verl's order is ["weights"], push weights, then ["kv_cache"].
        Weight contents survive only with enable_weights_cpu_backup. Default: config.offload_tags."""
        tags = list(tags) if tags is not None else list(self.config.offload_tags)
        await self.tm.resume_memory_occupation(self.io.ResumeMemoryOccupationReqInput(tags=tags), None)
        self._released.difference_update(tags)
        self._update_gate()

    def set_queue_key(self, key: QueueKey | None) -> None:
        """SGLang orders its own queue; what reaches it is one int per request, higher
        first (priority_of: the request's tool_count, the leading term of the agentic
        key), and only with enable_priority_scheduling. Within a priority it is FCFS."""
        self._queue_key = key

    def _update_gate(self) -> None:
        if self._paused or self._exporting or self._released:
            self._gate.clear()
        else:
            self._gate.set()
        self._progress.set()  # a step() waiting for results re-checks has_work
