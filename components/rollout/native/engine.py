"""The native rollout engine: continuous batching with a block KV cache and a radix
prefix cache, in plain torch (CPU or one GPU). Implements `RolloutEngine`.

`step()` is one scheduler iteration: a prefill of newly admitted requests or one
decode step for all running ones. The model runs synchronously inside it (no await
in the middle), so a step is atomic with respect to the other methods.

Semantics the controller relies on:
- pause(): no step runs until resume(); requests keep their KV; add/abort/export work.
- has_work(): there is something step() would do now (False while paused or released).
- export_inflight(): removes every unfinished request and returns prompt + tokens so
  far; import_inflight() on any engine re-prefills them and continues at the right
  output positions (seeded sampling makes the continuation exact).
- update_weights(): later tokens use the new weights; the prefix cache is emptied
  (its KV came from the old ones); running requests keep their already computed KV.
- release_memory(): only with no running request (abort or export them first); drops
  the KV tensors and the prefix cache, waiting requests stay queued; resume_memory()
  re-allocates them.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence as Seq

import torch

from dynarl.components.model.io import load_weights
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import (EngineLoad, GenerationRequest, GenerationResult, InflightRequest, KVBlocks,
                                            QueueKey)
from dynarl.components.rollout.native.block_manager import BlockManager
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.model_runner import ModelRunner
from dynarl.components.rollout.native.radix_cache import RadixCache
from dynarl.components.rollout.native.sampling import sample
from dynarl.components.rollout.native.scheduler import Scheduler, fifo_key
from dynarl.components.rollout.native.sequence import Sequence


@dataclass(frozen=True, slots=True)
class NativeEngineStats:
    """The native engine's counters beyond EngineLoad (read in its own process: benchmarks, tests)."""
    prefill_tokens: int
    cached_prefill_tokens: int
    """Prompt tokens the prefix cache served."""
    preemptions: int
    used_blocks: int
    reprefill_tokens: int
    """Tokens computed again for requests moved here without their KV."""
    kv_imported_tokens: int
    kv_refused: int


class NativeRolloutEngine:
    steps_on_loop = True

    def __init__(self, model: Qwen2ForCausalLM, config: NativeEngineConfig | None = None, weight_version: int = 0):
        self.config = config = config or NativeEngineConfig()
        self.model = model.eval()
        self.weight_version = weight_version
        max_model_len = config.max_model_len or model.config.max_position_embeddings
        if max_model_len > model.config.max_position_embeddings:
            raise ValueError(f"max_model_len ({max_model_len}) exceeds the model's max_position_embeddings "
                             f"({model.config.max_position_embeddings})")
        self.runner = ModelRunner(model, config.num_blocks, config.block_size)
        self.scheduler = Scheduler(
            BlockManager(config.num_blocks, config.block_size, on_grow=self.runner.ensure_zeroed),
            RadixCache(config.block_size) if config.enable_prefix_cache else None,
            max_num_seqs=config.max_num_seqs, max_prefill_tokens=config.max_prefill_tokens,
            max_model_len=max_model_len)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.released = False
        self.kv_imported_tokens = self.kv_refused = 0
        """Tokens of KV installed from other engines; imports refused (other weights)."""
        self.kv_import_s = 0.0
        """Wall seconds its import_kv calls took."""
        self.prefill_s, self.prefill_new_tokens = 0.0, 0
        """Wall seconds of prefill batches and the tokens they computed."""
        self._seqs: dict[str, Sequence] = {}
        self._order = 0
        self._ready: list[GenerationResult] = []  # finished outside step() (import of a complete request)
        self._watched: dict[str, GenerationResult | None] = {}  # ids a generate() call waits for

    # -- requests -------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        self._add(self._checked(Sequence(request, self._next_order())))

    def _next_order(self) -> int:
        self._order += 1
        return self._order

    def _checked(self, seq: Sequence) -> Sequence:
        if seq.request_id in self._seqs:
            raise ValueError(f"request_id {seq.request_id!r} is already in this engine")
        if max(seq.token_ids) >= self.model.config.vocab_size or min(seq.token_ids) < 0:
            raise ValueError(f"request {seq.request_id!r}: token ids must be in [0, {self.model.config.vocab_size})")
        self.scheduler.check_fits(seq)
        return seq

    def _add(self, seq: Sequence) -> None:
        reason = seq.check_finished(self.scheduler.max_model_len) if seq.num_output_tokens else None
        if reason is not None:  # imported already complete: nothing to compute
            seq.finish_reason = reason
            self._ready.append(self._result(seq))
            return
        self.scheduler.add(seq)
        self._seqs[seq.request_id] = seq

    def running_request_ids(self) -> list[str]:
        """Requests admitted and holding KV now (a bench observes admission with it)."""
        return [seq.request_id for seq in self.scheduler.running]

    def has_work(self) -> bool:
        if self._ready:
            return True
        return not (self.scheduler.paused or self.released) and self.scheduler.has_work()

    async def step(self) -> list[GenerationResult]:
        results, self._ready = self._ready, []
        if not (self.scheduler.paused or self.released):
            batch = self.scheduler.schedule()
            if batch is not None:
                began = time.perf_counter()
                # sample on the CPU: the seeded streams are then the same whatever device ran the model
                logits = self.runner.run(batch).float().cpu()
                if batch.is_prefill:  # its measured cost per token (EngineLoad.prefill_s_per_token)
                    self.prefill_s += time.perf_counter() - began
                    self.prefill_new_tokens += sum(s.num_tokens - s.num_cached_tokens for s in batch.seqs)
                tokens, logprobs = sample(logits, [s.request.sampling for s in batch.seqs],
                                          [s.num_output_tokens for s in batch.seqs], self.generator)
                for seq in self.scheduler.postprocess(batch, tokens, logprobs, self.weight_version):
                    del self._seqs[seq.request_id]
                    results.append(self._result(seq))
        self._record(results)
        return results

    async def generate(self, requests: Seq[GenerationRequest]) -> list[GenerationResult]:
        """Add the requests and step until each has a result (in the order given). Other
        coroutines may pause, abort or export meanwhile: an exported request's result
        here is its partial output with finish_reason 'abort' (it continues elsewhere)."""
        ids = [r.request_id for r in requests]
        if len(set(ids)) != len(ids):
            raise ValueError("request ids in one generate() call must be unique")
        seqs = [self._checked(Sequence(r, self._next_order())) for r in requests]  # all or nothing
        self._watched.update({rid: None for rid in ids})
        try:
            for seq in seqs:
                self._add(seq)
            while any(self._watched[rid] is None for rid in ids):
                if self.has_work():
                    await self.step()
                    await asyncio.sleep(0)  # let pause/abort/export callers in between steps
                else:
                    await asyncio.sleep(0.001)
            return [result for rid in ids if (result := self._watched[rid]) is not None]  # (all of them)
        finally:
            for rid in ids:
                self._watched.pop(rid, None)

    def _record(self, results: list[GenerationResult]) -> None:
        for result in results:
            if result.request_id in self._watched:
                self._watched[result.request_id] = result

    def _result(self, seq: Sequence) -> GenerationResult:
        return GenerationResult(
            request_id=seq.request_id, prompt_token_ids=list(seq.request.prompt_token_ids),
            output_token_ids=seq.output_token_ids, output_logprobs=list(seq.output_logprobs),
            finish_reason=seq.finish_reason or "abort",
            weight_version=seq.weight_version if seq.weight_version >= 0 else self.weight_version,
            cached_tokens=seq.num_cached_tokens)

    # -- control --------------------------------------------------------------------
    async def load(self) -> EngineLoad:
        s = self.scheduler
        held = self._seqs.values()
        return EngineLoad(active_kv_tokens=s.active_kv_tokens(), kv_capacity_tokens=s.blocks.capacity_tokens,
                          num_running=len(s.running), num_waiting=len(s.waiting),
                          cache_hit_tokens=s.num_cached_tokens,
                          num_preemptions=s.num_preemptions, reprefill_tokens=s.num_reprefill_tokens,
                          prefill_s_per_token=self.prefill_s / max(self.prefill_new_tokens, 1),
                          kv_import_s=self.kv_import_s,
                          generated_tokens=sum(q.num_output_tokens for q in held),
                          budget_tokens=sum(max(q.request.sampling.max_new_tokens - q.num_output_tokens, 0)
                                            for q in held))

    def stats(self) -> NativeEngineStats:
        """Counters beyond EngineLoad (benchmarks: prefix-cache savings, preemptions)."""
        s = self.scheduler
        return NativeEngineStats(prefill_tokens=s.num_prefill_tokens, cached_prefill_tokens=s.num_cached_tokens,
                                 preemptions=s.num_preemptions, used_blocks=s.blocks.num_used_blocks,
                                 reprefill_tokens=s.num_reprefill_tokens, kv_imported_tokens=self.kv_imported_tokens,
                                 kv_refused=self.kv_refused)

    async def abort(self, request_ids: Seq[str]) -> list[GenerationResult]:
        results = []
        for seq in self.scheduler.abort(request_ids):
            del self._seqs[seq.request_id]
            results.append(self._result(seq))
        self._record(results)
        return results

    async def pause(self) -> None:
        self.scheduler.paused = True

    async def resume(self) -> None:
        self.scheduler.paused = False

    async def export_inflight(self) -> list[InflightRequest]:
        seqs = self.scheduler.take_all()
        self._seqs.clear()
        self._record([self._result(s) for s in seqs if s.request_id in self._watched])
        return [InflightRequest(s.request, s.output_token_ids, list(s.output_logprobs)) for s in seqs]

    async def export_kv(self, item: InflightRequest) -> KVBlocks | None:
        """The KV of the longest prefix of the request's tokens still in the prefix cache
        (an exported request's computed full blocks stay there after export_inflight)."""
        token_ids = list(item.request.prompt_token_ids) + list(item.output_token_ids)
        cache = self.scheduler.cache
        if cache is None or self.runner.cache is None:
            return None
        blocks = cache.match_prefix(token_ids, touch=False)
        if not blocks:
            return None
        index = torch.tensor(blocks, dtype=torch.long, device=self.runner.device)
        kv = self.runner.cache
        return KVBlocks(list(token_ids[:len(blocks) * kv.block_size]), kv.k[:, index].cpu(), kv.v[:, index].cpu(),
                        self.weight_version, item.request.request_id)

    def import_kv(self, kv: KVBlocks, across_nodes: bool = False) -> int:
        """Into the prefix cache, where the weights and the cache's geometry match; else
        refused (counted in stats()'s kv_refused: the request is re-prefilled)."""
        cache = self.runner.cache
        if (cache is None or self.scheduler.cache is None or kv.weight_version != self.weight_version
                or tuple(kv.k.shape[2:]) != tuple(cache.k.shape[2:]) or kv.k.shape[0] != cache.k.shape[0]):
            self.kv_refused += 1
            return 0

        def fill(blocks: list[int], first: int) -> None:
            index = torch.tensor(blocks, dtype=torch.long, device=cache.k.device)
            cache.k[:, index] = kv.k[:, first:first + len(blocks)].to(cache.k.device, cache.k.dtype)
            cache.v[:, index] = kv.v[:, first:first + len(blocks)].to(cache.v.device, cache.v.dtype)
        begun = time.perf_counter()
        installed = self.scheduler.cache_prefix(kv.token_ids, fill)
        self.kv_import_s += time.perf_counter() - begun
        self.kv_imported_tokens += installed
        return installed

    def import_inflight(self, items: Seq[InflightRequest]) -> None:
        if len({item.request.request_id for item in items}) != len(items):
            raise ValueError("request ids in one import_inflight() call must be unique")
        seqs = [self._checked(Sequence(item.request, self._next_order(), list(item.output_token_ids),
                                       list(item.output_logprobs))) for item in items]
        for seq in seqs:
            seq.imported = True
            self._add(seq)

    async def update_weights(self, named_tensors: Any, version: int) -> None:
        """named_tensors: iterable of (HF name, tensor) or a mapping; any subset of the parameters."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        load_weights(self.model, items)
        self.weight_version = version
        self.scheduler.reset_prefix_cache()

    async def release_memory(self) -> None:
        """Drop the KV tensors and the prefix cache (colocated role switch); waiting
        requests stay queued. Like SGLang, refuses while requests are running."""
        if self.scheduler.running:
            raise RuntimeError(f"release_memory with {len(self.scheduler.running)} running requests; "
                               "abort or export them first")
        self.scheduler.reset_prefix_cache()
        self.runner.release()
        self.released = True

    async def resume_memory(self) -> None:
        self.runner.allocate()
        self.released = False

    def set_queue_key(self, key: QueueKey | None) -> None:
        self.scheduler.queue_key = key or fifo_key
