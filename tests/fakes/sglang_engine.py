"""A fake sglang 0.5.23 Engine + TokenizerManager + scheduler, in one process.

It keeps the real call signatures (sglang_io_struct.REAL_SIGNATURES; a wrong keyword
raises TypeError) and the behaviours the adapter must respect (BACKENDS.md A1-A9):
- Engine's sync methods fail inside a running loop (they call run_until_complete).
- A request that reaches the TokenizerManager while it is paused waits there, where
  abort cannot reach it; it is counted in `parked_while_paused`.
- abort_request: synchronous, prefix match on the rid, once per rid (abort_sent),
  reaches only requests the scheduler already has; abort_all reaches all of those.
- pause "retract" moves running requests back to the queue and frees their KV.
- a non-streaming request reports its tokens to the TokenizerManager only every
  force_stream_interval tokens (SGLANG_FORCE_STREAM_INTERVAL, 50) and at the end, so
  aborting a queued (e.g. retracted) request returns only the reported prefix.
- ignore_eos skips every token-based stop, the listed stop ids too; without it the
  model's EOS stops as well as the listed ids.
- load snapshots are not refreshed while paused (the last one before the pause).
- 0.5.23 refuses tensor updates outside begin/end_weight_update (the old-build variant
  has no session); an update waits for in-flight generations unless paused; an update
  or flush_cache with queued work reports success=False (queue ignored while paused).
- release_memory_occupation asserts the scheduler is idle (queue ignored while paused).
  The batch that finished the last request stays the scheduler's last batch until its
  loop runs once more with nothing to do, and idle needs no last batch (seen on the
  real engine: a release right after the last result arrived failed the assertion);
  a retract pause or a flush clears it; flush_cache(timeout_s) waits for idle.

Tokens are a deterministic function of the whole sequence, so a request continued on
another engine yields exactly the tokens of an uninterrupted run.
"""
from __future__ import annotations

import asyncio
import time
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from . import sglang_io_struct as io

VOCAB = 128
EOS = 2


def next_token(seq: list[int]) -> tuple[int, float]:
    h = (sum((i + 1) * t for i, t in enumerate(seq)) * 2654435761 + len(seq)) % (1 << 32)
    return 3 + h % (VOCAB - 3), -0.1 * (1 + h % 7)


@dataclass
class FakeReq:
    rid: str
    input_ids: list[int]
    params: dict
    priority: int | None
    arrival: int
    return_logprob: bool
    future: asyncio.Future
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    sent: int = 0
    """Output tokens already reported to the TokenizerManager."""


class FakeTokenizerManagerOld:
    """sglang before weight-update sessions (no begin/end_weight_update)."""

    def __init__(self, *, max_total_num_tokens: int = 256, tp_size: int = 1, force_stream_interval: int = 50,
                 enable_priority_scheduling: bool = False, decode: Callable[[Any], list] | None = None,
                 tick_s: float = 0.0) -> None:
        self.max_total_num_tokens, self.tp_size = max_total_num_tokens, tp_size
        self.tick_s = tick_s
        """Seconds per decode step (0: as fast as the loop turns)."""
        self.force_stream_interval = force_stream_interval  # SGLANG_FORCE_STREAM_INTERVAL
        self.enable_priority_scheduling = enable_priority_scheduling
        self.decode = decode
        self.is_pause = False
        self.released: set[str] = set()
        self.rid_to_state: dict[str, dict] = {}
        self.waiting: list[FakeReq] = []
        self.running: list[FakeReq] = []
        self.in_generate = 0          # requests between entry and response (the reader lock)
        self.parked_while_paused = 0
        self.weights: dict[str, Any] = {}
        self.weight_version: str | None = None
        self.update_calls: list[dict] = []
        self.finished_seqs: list[list[int]] = []
        self.admitted_order: list[str] = []
        self.received: list[FakeReq] = []
        self._arrivals = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._cond = asyncio.Condition()
        self._ticker: asyncio.Task | None = None
        self._snapshot: io.LoadSnapshot | None = None
        self.last_batch = False  # a batch ran in the scheduler's last loop iteration

    def auto_create_handle_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._ticker = loop.create_task(self._run_scheduler())
        elif self._loop is not loop:
            raise RuntimeError("TokenizerManager is bound to another event loop")

    # ---- generation (Engine.async_generate -> here) ------------------------------
    async def generate(self, input_ids: list[int], sampling_params: dict, rid: str, priority: int | None,
                       return_logprob: bool) -> dict:
        self.auto_create_handle_loop()
        if rid in self.rid_to_state:
            raise ValueError(f"Duplicate request ID {rid}")
        req = FakeReq(rid, list(input_ids), dict(sampling_params), priority, next(self._arrivals),
                      return_logprob, self._loop.create_future())
        self.rid_to_state[rid] = {"abort_sent": False}
        self.received.append(req)
        self.in_generate += 1
        try:
            async with self._cond:
                if self.is_pause:
                    self.parked_while_paused += 1
                await self._cond.wait_for(lambda: not self.is_pause)
            await asyncio.sleep(0)  # tokenizing: the request is not at the scheduler yet
            self.waiting.append(req)
            self._wake.set()
            return await req.future
        finally:
            self.in_generate -= 1
            self.rid_to_state.pop(rid, None)

    async def _run_scheduler(self) -> None:
        while True:
            await self._wake.wait()
            if not self._tick():
                self._wake.clear()
            await asyncio.sleep(self.tick_s)

    def _used(self) -> int:
        return sum(len(r.input_ids) + len(r.output_ids) for r in self.running)

    def _reserved(self) -> int:
        return sum(len(r.input_ids) + r.params.get("max_new_tokens", 128) for r in self.running)

    def _tick(self) -> bool:
        if self.is_pause or self.released or not (self.waiting or self.running):
            self.last_batch = False
            return False
        key = (lambda r: (-(r.priority or 0), r.arrival)) if self.enable_priority_scheduling else (lambda r: r.arrival)
        for req in sorted(self.waiting, key=key):
            # admission reserves the whole token budget, so running requests never outgrow the KV
            need = len(req.input_ids) + req.params.get("max_new_tokens", 128)
            if self._reserved() + need > self.max_total_num_tokens:
                break
            self.waiting.remove(req)
            self.running.append(req)
            self.admitted_order.append(req.rid)
            if not req.output_ids:
                req.cached_tokens = self._cached_prefix(req.input_ids)
        for req in list(self.running):
            token, logprob = next_token(req.input_ids + req.output_ids)
            req.output_ids.append(token)
            req.logprobs.append(logprob)
            p = req.params
            # as sglang's Req._check_token_based_finish: ignore_eos skips the stop ids too
            if not p.get("ignore_eos") and (token in (p.get("stop_token_ids") or ()) or token == EOS):
                self._finish(req, {"type": "stop", "matched": token})
            elif len(req.output_ids) >= p.get("max_new_tokens", 128):
                self._finish(req, {"type": "length", "length": len(req.output_ids)})
            elif len(req.output_ids) % self.force_stream_interval == 0:
                req.sent = len(req.output_ids)  # a non-streaming request still reports every N tokens
        self.last_batch = True
        return True

    def _cached_prefix(self, ids: list[int]) -> int:
        best = 0
        for seq in self.finished_seqs:
            n = next((i for i, (a, b) in enumerate(zip(seq, ids)) if a != b), min(len(seq), len(ids)))
            best = max(best, n)
        return min(best, len(ids) - 1)

    def _finish(self, req: FakeReq, reason: dict, visible: int | None = None) -> None:
        """visible: output tokens the TokenizerManager has (an abort of a queued request
        answers with what was reported so far; the rest stays in the scheduler)."""
        for queue in (self.waiting, self.running):
            if req in queue:
                queue.remove(req)
        if visible is not None:
            del req.output_ids[visible:], req.logprobs[visible:]
        if reason["type"] != "abort":
            self.finished_seqs.append(req.input_ids + req.output_ids)
        meta = {"id": req.rid, "finish_reason": reason, "prompt_tokens": len(req.input_ids),
                "completion_tokens": len(req.output_ids), "cached_tokens": req.cached_tokens,
                "weight_version": self.weight_version}
        if req.return_logprob:
            meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(req.logprobs, req.output_ids)]
        req.future.set_result({"output_ids": list(req.output_ids), "meta_info": meta})

    # ---- control ---------------------------------------------------------------
    def abort_request(self, rid: str = "", abort_all: bool = False):
        if not abort_all and not rid:
            return
        if not abort_all:
            state = self.rid_to_state.get(rid)
            if state is None or state["abort_sent"]:
                return
            state["abort_sent"] = True
        for req in list(self.waiting) + list(self.running):  # only what the scheduler has
            if abort_all or req.rid.startswith(rid):
                queued = req in self.waiting
                self._finish(req, {"type": "abort", "message": "Abort request", "status_code": 499, "err_type": None},
                             visible=req.sent if queued else None)

    async def pause_generation(self, obj: io.PauseGenerationReqInput):
        assert isinstance(obj, io.PauseGenerationReqInput)
        async with self._cond:
            if not self.is_pause:
                self._publish()  # the last snapshot until continue_generation
            self.is_pause = True
            if obj.mode == "retract":
                self.waiting[:0] = self.running  # back to the queue, KV freed
                self.running.clear()
                self.last_batch = False
            elif obj.mode == "abort":
                self.abort_request(abort_all=True)

    async def continue_generation(self, obj: io.ContinueGenerationReqInput):
        assert isinstance(obj, io.ContinueGenerationReqInput)
        async with self._cond:
            self.is_pause = False
            self._cond.notify_all()
        self._wake.set()

    async def get_loads(self, include: list | None = None, dp_rank: int | None = None):
        """The scheduler publishes its snapshot as it runs; while paused it publishes
        none, so the last one before the pause is what comes back (sglang 0.5.23)."""
        if not self.is_pause:
            self._publish()
        return [self._snapshot]

    def _publish(self) -> None:
        used = self._used()
        self._snapshot = io.LoadSnapshot(dp_rank=0, num_running_reqs=len(self.running),
                                         num_waiting_reqs=len(self.waiting), num_used_tokens=used,
                                         num_total_tokens=used, max_total_num_tokens=self.max_total_num_tokens,
                                         token_usage=used / self.max_total_num_tokens)

    def _idle(self) -> bool:
        return not self.running and not self.last_batch and (self.is_pause or not self.waiting)

    async def flush_cache(self, timeout_s: float | None = None):
        """timeout_s > 0: waits up to that long for the scheduler to be idle (sglang's
        SchedulerFlushWrapper defers the flush; its idle check counts the queue even
        while paused)."""
        idle = lambda: not self.running and not self.last_batch and not self.waiting  # noqa: E731
        deadline = time.monotonic() + (timeout_s or 0.0)
        while not (idle() if timeout_s else self._idle()) and timeout_s and time.monotonic() < deadline:
            self._wake.set()
            await asyncio.sleep(0.001)
        if not (idle() if timeout_s else self._idle()):
            return io.FlushCacheReqOutput(success=False, message="Cache not flushed: pending requests")
        self.finished_seqs.clear()
        self.last_batch = False
        return io.FlushCacheReqOutput(success=True)

    async def _writer_lock(self) -> None:
        """Updates outside a pause wait until no generation is in flight."""
        while not self.is_pause and self.in_generate:
            await asyncio.sleep(0.001)

    async def update_weights_from_tensor(self, obj: io.UpdateWeightsFromTensorReqInput, request=None):
        assert isinstance(obj, io.UpdateWeightsFromTensorReqInput)
        await self._writer_lock()
        if hasattr(self, "begin_weight_update") and not self.session_open:
            return False, "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"
        if len(obj.serialized_named_tensors) != self.tp_size:
            raise IndexError(f"{len(obj.serialized_named_tensors)} payloads for tp_size {self.tp_size}")
        for payload in obj.serialized_named_tensors:  # each TP rank deserializes its own
            self.weights.update(self.decode(payload, obj.load_format))
        self.update_calls.append({"flush_cache": obj.flush_cache, "load_format": obj.load_format})
        self.weight_version = obj.weight_version
        if obj.flush_cache and not (await self.flush_cache()).success:
            return False, "Weights were updated, but the cache was not flushed because requests are still running"
        return True, "Success"

    async def release_memory_occupation(self, obj: io.ReleaseMemoryOccupationReqInput, request=None):
        assert isinstance(obj, io.ReleaseMemoryOccupationReqInput)
        assert self._idle(), "release_memory_occupation should be called only when server is idle."
        self.released.update(obj.tags or ("kv_cache", "weights", "cuda_graph"))
        self.finished_seqs.clear()

    async def resume_memory_occupation(self, obj: io.ResumeMemoryOccupationReqInput, request=None):
        assert isinstance(obj, io.ResumeMemoryOccupationReqInput)
        self.released.difference_update(obj.tags or ("kv_cache", "weights", "cuda_graph"))
        self._wake.set()

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()


class FakeTokenizerManager(FakeTokenizerManagerOld):
    """sglang 0.5.23: tensor updates only inside a weight-update session."""
    session_open = False

    async def begin_weight_update(self, obj: io.BeginWeightUpdateReqInput, request=None):
        assert isinstance(obj, io.BeginWeightUpdateReqInput)
        await self._writer_lock()
        if self.session_open:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session_open = True
        return True, "Success"

    async def end_weight_update(self, obj: io.EndWeightUpdateReqInput, request=None):
        assert isinstance(obj, io.EndWeightUpdateReqInput)
        await self._writer_lock()
        if not self.session_open:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session_open = False
        return True, "Success"


def _no_running_loop(name: str):
    def method(self, *args, **kwargs):
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise NotImplementedError(f"the fake has no synchronous {name}") from None
        raise RuntimeError("This event loop is already running")  # what run_until_complete raises
    method.__name__ = name
    return method


class FakeEngine:
    def __init__(self, tokenizer_manager: FakeTokenizerManagerOld) -> None:
        self.tokenizer_manager = tokenizer_manager
        self.shut_down = False

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, image_data=None,
                             audio_data=None, video_data=None, mm_hashes=None, mm_content_hashes=None,
                             return_logprob=False, logprob_start_len=None, top_logprobs_num=None,
                             token_ids_logprob=None, lora_path=None, custom_logit_processor=None,
                             require_reasoning=False, return_hidden_states=False, return_routed_experts=False,
                             routed_experts_start_len=0, stream=False, bootstrap_host=None, bootstrap_port=None,
                             bootstrap_room=None, routed_dp_rank=None, disagg_prefill_dp_rank=None, kv_hints=None,
                             data_parallel_rank=None, external_trace_header=None, rid=None, session_params=None,
                             priority=None, session_id=None, *, cache_salt=None):
        if prompt is not None or stream or not isinstance(rid, str):
            raise NotImplementedError("the fake serves single non-streaming token-id requests with a rid")
        if not (isinstance(input_ids, list) and input_ids and all(isinstance(t, int) for t in input_ids)):
            raise TypeError("input_ids must be a non-empty list of ints for one request")
        unknown = set(sampling_params or {}) - io.SAMPLING_FIELDS
        if unknown:
            raise TypeError(f"SamplingParams: unexpected keyword arguments {sorted(unknown)}")
        if priority is not None and not (isinstance(priority, int) and -(1 << 63) <= priority < (1 << 63)):
            raise ValueError("priority must be a signed 64-bit integer")
        return await self.tokenizer_manager.generate(input_ids, sampling_params or {}, rid, priority,
                                                     bool(return_logprob))

    generate = _no_running_loop("generate")
    flush_cache = _no_running_loop("flush_cache")
    begin_weight_update = _no_running_loop("begin_weight_update")
    end_weight_update = _no_running_loop("end_weight_update")
    update_weights_from_tensor = _no_running_loop("update_weights_from_tensor")
    release_memory_occupation = _no_running_loop("release_memory_occupation")
    resume_memory_occupation = _no_running_loop("resume_memory_occupation")

    def shutdown(self) -> None:
        self.tokenizer_manager.close()
        self.shut_down = True
