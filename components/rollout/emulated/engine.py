"""EmulatedRolloutEngine: the RolloutEngine contract with cost-model time instead of tensors.

One scheduler iteration, as in a chunked-prefill engine:
  1. make room in the KV pool for one more token per running request (evict
     unpinned prefix-cache blocks, then preempt the newest request: recompute-style,
     it keeps its output count and re-prefills prompt + output when readmitted);
  2. admit waiting requests in queue-key order while their KV fits, up to
     max_num_seqs and max_prefill_tokens (an over-long prompt is admitted alone);
  3. sleep prefill_time(new prompt tokens not in the prefix cache)
     + decode_step_time(running batch, mean context) (+ any pending weight sync);
  4. every running request gains one token; finished ones are returned.
So a request alone with a P-token prompt and N output tokens costs
prefill(P) + sum_{k<N} decode(1, P+k): the first token is charged a decode step too.

With coalesce_steps (default) one step() runs every iteration up to the next
event (a finish, a preemption, a possible admission) in one sleep (decode_run.py):
thousands of tail steps cost one timer. Any call that changes the engine
(add_request, abort, export, pause, update_weights, ...) first applies the
iterations already completed and ends the run after the one in flight, and load()
applies completed iterations, so every observation equals a step-by-step run's.

Response length: every response is exactly sampling.max_new_tokens tokens. Without
stop tokens finish_reason is 'length'; with stop_token_ids the last token is
stop_token_ids[0] (no earlier one is a stop token) and finish_reason is 'stop'.
Token ids and log-probs are a pure function of (seed, position) (tokens.py).

KV and queue bookkeeping lives in scheduler.py; this file adds time and the API.
"""
from __future__ import annotations

import asyncio
from typing import Any, Sequence

from dynarl.components import costmodel
from dynarl.components.rollout.base import (EngineLoad, GenerationRequest, GenerationResult,
                                            InflightRequest, KVBlocks, QueueKey)
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.components.trainer.emulated.layout import synced_weight_bytes
from dynarl.core.priority import PriorityConfig

from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.decode_run import DecodeRun
from dynarl.components.rollout.emulated.request_state import RequestState
from dynarl.components.rollout.emulated.scheduler import Scheduler


class _Batch:
    """The results one generate() call waits for."""
    __slots__ = ("results", "remaining", "done")

    def __init__(self, n: int):
        self.results: list[GenerationResult | None] = [None] * n
        self.remaining = n
        self.done = asyncio.Event()


class EmulatedRolloutEngine:
    steps_on_loop = False

    def __init__(self, config: EmulatedRolloutConfig | None = None, weight_version: int = 0):
        self.config = config or EmulatedRolloutConfig()
        self.model = self.config.model_shape
        self.device = self.config.device_spec
        self.capacity = self.config.capacity_tokens()
        self.weight_version = weight_version
        self.scheduler = Scheduler(self.config, self.capacity, self.model.vocab_size)
        self._ready: list[GenerationResult] = []
        self._waiters: dict[str, tuple[_Batch, int]] = {}
        self._pending_delay = 0.0
        self._paused = self._released = self._stepping = False
        self._run: DecodeRun | None = None
        self._runnable = asyncio.Event()
        self._runnable.set()
        self.num_steps = 0
        """Scheduler iterations so far (a coalesced step() counts each)."""
        self.busy_time = 0.0
        """Cost-model seconds spent in steps (before time_scale)."""
        self.last_step_time = 0.0
        """Cost-model seconds of the last step() call."""
        self._exported_kv: dict[str, int] = {}
        """The last export's running requests -> the tokens of KV they held (full blocks)."""
        self._kv_in: dict[str, int] = {}
        """Request id -> tokens of KV imported for it (import_kv), until it is imported or added."""
        self.kv_refused = 0
        self.kv_transfer_s = 0.0
        """Cost-model seconds of KV moved in (charged to the next step)."""
        scale, tp = self.config.time_scale, self.config.tp  # (per token, in loop seconds: load())
        self._prefill_s_per_token = scale * costmodel.prefill_time(self.model, self.device, 1, tp)
        self._kv_move_s_per_token = scale * costmodel.kv_transfer_time(self.model, self.device, 1, tp,
                                                                       across_nodes=True)
        if self.config.queue == "priority":  # the native engine's key function, not a copy of it
            self.set_queue_key(make_queue_key("priority", PriorityConfig(
                max_bonus_s=self.config.priority_window_s)))

    # --- requests in ------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> None:
        self.scheduler.check(request, set())
        self._cut()
        state = self.scheduler.new_state(request)
        state.kv_tokens = self._kv_in.pop(request.request_id, 0)  # a follow-up turn's context, moved here
        self._enqueue(state)

    def import_inflight(self, items: Sequence[InflightRequest]) -> None:
        """Continue requests exported by another engine; their tokens so far are kept."""
        seen: set[str] = set()
        for item in items:
            self.scheduler.check(item.request, seen)
            if len(item.output_token_ids) != len(item.output_logprobs):
                raise ValueError(f"request {item.request.request_id}: {len(item.output_token_ids)} tokens "
                                 f"but {len(item.output_logprobs)} logprobs")
        self._cut()
        for item in items:
            state = self.scheduler.new_state(item.request, list(item.output_token_ids), list(item.output_logprobs))
            state.kv_tokens = self._kv_in.pop(item.request.request_id, 0)
            self._enqueue(state)

    def _enqueue(self, state: RequestState) -> None:
        if state.out_base >= state.target:  # imported already complete
            self._ready.append(self._result(state, state.out_base))
        else:
            self.scheduler.enqueue(state)

    def set_queue_key(self, key: QueueKey | None) -> None:
        """None restores FIFO: (arrival_time, admission order). A key is evaluated when a
        request enters the waiting queue (and for all waiting ones here), with the prompt
        tokens the prefix cache holds at that moment, so admission stays O(log n)."""
        self._cut()
        self.scheduler.set_queue_key(key)

    # --- scheduling ------------------------------------------------------------

    async def step(self) -> list[GenerationResult]:
        """One scheduler iteration (or, coalesced, every iteration up to the next event);
        returns the requests that finished. Paused or released: returns at once."""
        if self._stepping:
            raise RuntimeError("step() is already running on this engine; drive it from one task")
        finished, self._ready = self._ready, []
        if self._paused or self._released:
            await asyncio.sleep(0)
            return self._resolve(finished)
        self._stepping = True
        sched, cfg = self.scheduler, self.config
        try:
            prefill_tokens = sched.schedule()
            batch = len(sched.running)
            first, self._pending_delay = self._pending_delay, 0.0
            if prefill_tokens:
                first += costmodel.prefill_time(self.model, self.device, prefill_tokens, cfg.tp)
            steps = sched.steps_until_event() if cfg.coalesce_steps else 1
            run = self._run = DecodeRun(asyncio.get_running_loop(), first, batch,
                                        sched.context_tokens / batch if batch else 0.0, steps,
                                        self.model, self.device, cfg.tp, cfg.time_scale)
            try:
                await run.finished
            except asyncio.CancelledError:
                self._catch_up()
                raise
            # abort()/export_inflight() may have shrunk the batch meanwhile: advance()
            # grows only what is still running.
            for state, n, ids in sched.advance(run.steps - run.done):
                finished.append(self._result(state, n, output_ids=ids))
            self.last_step_time = run.time_of(run.steps)
            self.busy_time += self.last_step_time
            self.num_steps += run.steps
        finally:
            if self._run is not None:
                self._run.cancel()
            self._run = None
            self._stepping = False
        return self._resolve(finished)

    def _catch_up(self) -> None:
        """Apply the iterations of the run in flight that have already ended."""
        run = self._run
        if run is None:
            return
        done = run.completed_by_now()
        if done > run.done:
            early = self.scheduler.advance(done - run.done)
            assert not early, "a run never spans a finish"
            run.done = done
            # as step by step: the step in flight has reserved its tokens
            self.scheduler.fits(len(self.scheduler.running))

    def _cut(self) -> None:
        """Something outside changes the engine: end the run after the step in flight."""
        if self._run is not None:
            self._catch_up()
            self._run.stop_after(self._run.done + 1)

    def _result(self, state: RequestState, n: int, finish_reason: str | None = None,
                output_ids: list[int] | None = None) -> GenerationResult:
        if finish_reason is None:
            finish_reason = "stop" if state.request.sampling.stop_token_ids else "length"
        return state.result(n, finish_reason, self.weight_version, self.model.vocab_size, output_ids,
                            lazy=self.config.lazy_outputs)

    def _resolve(self, results: list[GenerationResult]) -> list[GenerationResult]:
        for result in results:
            entry = self._waiters.pop(result.request_id, None)
            if entry is not None:
                batch, index = entry
                batch.results[index] = result
                batch.remaining -= 1
                if not batch.remaining:
                    batch.done.set()
        return results

    # --- driving ---------------------------------------------------------------

    def has_work(self) -> bool:
        sched = self.scheduler
        return bool(self._ready) or (not self._paused and not self._released
                                     and bool(sched.running or sched.waiting))

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]:
        """Add `requests` and drive step() until each has a result (in request order).
        Requests aborted or exported meanwhile come back with finish_reason 'abort'.
        This call is the engine's driver: do not run another step() loop beside it."""
        seen: set[str] = set()
        for request in requests:
            self.scheduler.check(request, seen)
        batch = _Batch(len(requests))
        for index, request in enumerate(requests):
            self._waiters[request.request_id] = (batch, index)
            self.add_request(request)
        while batch.remaining:
            if self._paused or self._released:
                await self._wait_runnable_or(batch.done)
            else:
                await self.step()
        return batch.results  # type: ignore[return-value]

    async def _wait_runnable_or(self, done: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(self._runnable.wait()), asyncio.ensure_future(done.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def load(self) -> EngineLoad:
        return self.load_now()

    def load_now(self) -> EngineLoad:
        """load(), synchronously (nothing here waits): for callers inside a step of the
        event loop that must not yield."""
        self._catch_up()
        sched = self.scheduler
        made = [s.num_output(sched.step) for s in sched.running.values()] + [s.out_base for s in sched.waiting.values()]
        targets = [s.target for s in sched.running.values()] + [s.target for s in sched.waiting.values()]
        generated = sum(made)
        return EngineLoad(active_kv_tokens=sched.active_kv_tokens(), kv_capacity_tokens=self.capacity,
                          num_running=len(sched.running), num_waiting=len(sched.waiting),
                          cache_hit_tokens=sched.cache_hit_tokens, num_preemptions=sched.num_preemptions,
                          generated_tokens=generated, reprefill_tokens=sched.num_reprefill_tokens,
                          budget_tokens=sum(targets) - generated, devices=self.config.tp,
                          prefill_s_per_token=self._prefill_s_per_token,
                          kv_move_s_per_token=self._kv_move_s_per_token,
                          kv_import_s=self.config.time_scale * self.kv_transfer_s)

    def running_request_ids(self) -> list[str]:
        """Requests admitted and holding KV now (the agentic worker's queue waits)."""
        self._catch_up()
        return list(self.scheduler.running)

    # --- control ---------------------------------------------------------------

    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]:
        self._cut()
        removed = self.scheduler.remove(request_ids)
        return self._resolve([self._result(state, n, "abort") for state, n in removed])

    async def export_inflight(self) -> list[InflightRequest]:
        """Take every running and waiting request out, with the tokens made so far, in
        admission order (as the native engine). A generate() waiting on them gets
        finish_reason 'abort'."""
        self._cut()
        sched = self.scheduler
        ids = [s.request_id for s in sorted([*sched.running.values(), *sched.waiting.values()],
                                            key=lambda s: s.order)]
        bs = self.config.block_size
        self._exported_kv = {s.request_id: (s.prompt_len + s.num_output(sched.step)) // bs * bs
                             for s in sched.running.values()}
        removed = sched.remove(ids)
        vocab = self.model.vocab_size
        self._resolve([self._result(state, n, "abort") for state, n in removed])
        return [state.inflight(n, vocab) for state, n in removed]

    async def pause(self) -> None:
        """Stop scheduling; running requests keep their KV. A step in flight completes."""
        self._cut()
        self._paused = True
        self._runnable.clear()

    async def resume(self) -> None:
        self._paused = False
        if not self._released:
            self._runnable.set()

    async def export_kv(self, item: InflightRequest) -> KVBlocks | None:
        """The KV a request of the last export_inflight held while it ran here, else the
        longest prefix of its tokens in the prefix cache (a finished turn's context):
        full blocks, no tensors, the token ids they cover; None if there is none."""
        self._catch_up()
        token_ids = list(item.request.prompt_token_ids) + list(item.output_token_ids)
        tokens = self._exported_kv.pop(item.request.request_id, 0) or self.scheduler.cached_prefix(token_ids)
        if not tokens:
            return None
        return KVBlocks(token_ids[:tokens], None, None, self.weight_version, item.request.request_id)

    def import_kv(self, kv: KVBlocks, across_nodes: bool = False) -> int:
        """Held for the request it came with (kv.request_id, imported next) where the
        weights match, else refused (counted in kv_refused: the request is re-prefilled);
        its admission then computes only the last block. The transfer
        (costmodel.kv_transfer_time, within a node or across) is charged to the next step.
        (The KV is not in the pool's accounting until that admission, nor in the prefix
        cache: it serves its own request only.)"""
        if kv.weight_version != self.weight_version:
            self.kv_refused += 1
            return 0
        self._cut()
        installed = len(kv.token_ids)
        self._kv_in[kv.request_id] = installed
        seconds = costmodel.kv_transfer_time(self.model, self.device, installed, self.config.tp, across_nodes)
        self._pending_delay += seconds
        self.kv_transfer_s += seconds
        return installed

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """`named_tensors`: a byte count, or (name, bytes-or-array) pairs; anything else counts
        as the full model. The transfer (bytes split over TP ranks, at the link bandwidth)
        is charged to the next step. The prefix cache is dropped: its KV came from old weights."""
        self._cut()
        self.weight_version = version
        bandwidth = self.config.weight_sync_bandwidth or self.device.link_bandwidth
        self._pending_delay += costmodel.weight_sync_time(
            payload_bytes(named_tensors, synced_weight_bytes(self.model)), bandwidth, self.config.tp)
        self.scheduler.flush_cache()

    async def release_memory(self) -> None:
        """Free KV and weights (colocated role switch: half of one, docs/COSTMODEL.md §3).
        Waiting requests stay queued."""
        if self.scheduler.running:
            raise RuntimeError(f"release_memory with {len(self.scheduler.running)} running requests; "
                               "abort or export them first")
        self._released = True
        self._runnable.clear()
        if self.scheduler.cache:
            self.scheduler.cache.evict_all()
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.config.time_scale)

    async def resume_memory(self) -> None:
        """Allocate KV and weights again (the other half of a role switch)."""
        await asyncio.sleep(costmodel.ROLE_SWITCH_S / 2 * self.config.time_scale)
        self._released = False
        if not self._paused:
            self._runnable.set()


def payload_bytes(named_tensors: Any, default: int) -> int:
    """Bytes in a weight update: a byte count, or (name, bytes-or-array) pairs; anything
    else (unknown payloads) counts as `default`, the full model."""
    if isinstance(named_tensors, (int, float)) and not isinstance(named_tensors, bool):
        return int(named_tensors)
    try:
        total = 0
        for _, value in named_tensors:
            total += int(value) if isinstance(value, (int, float)) else int(value.nbytes)
        return total
    except (TypeError, ValueError, AttributeError):
        return default
