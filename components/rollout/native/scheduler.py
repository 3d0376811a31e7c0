"""Continuous batching over a block KV cache. Plain Python (no torch).

Each `schedule()` returns one batch: a prefill of newly admitted sequences when any
waiting sequence fits, else one decode step for every running sequence.
- Admission follows the waiting order (queue key, then admission sequence) and stops
  at the first sequence that does not fit: a big request is not overtaken forever.
- A sequence reuses the longest cached prefix of its tokens; at least its last token
  is computed so its logits exist.
- Memory comes from free blocks, then from evicting unused cached blocks (LRU), then
  (decode only) from preempting the most recently admitted running sequence, whose KV
  is dropped and recomputed when it is admitted again. After a preemption no new
  sequence is admitted until a running one finishes, so the engine does not thrash.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence as Seq

from dynarl.components.rollout.base import GenerationRequest, QueueKey
from dynarl.components.rollout.native.block_manager import BlockManager
from dynarl.components.rollout.native.radix_cache import RadixCache
from dynarl.components.rollout.native.sequence import Sequence, Status


def fifo_key(request: GenerationRequest, cached_tokens: int) -> float:
    return request.arrival_time


@dataclass(slots=True)
class Batch:
    seqs: list[Sequence]
    is_prefill: bool
    """Prefill: each sequence computes token_ids[num_computed_tokens:]. Decode: its last token."""


class Scheduler:
    def __init__(self, block_manager: BlockManager, prefix_cache: RadixCache | None, *,
                 max_num_seqs: int, max_prefill_tokens: int, max_model_len: int):
        for name, value in (("max_num_seqs", max_num_seqs), ("max_prefill_tokens", max_prefill_tokens),
                            ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.blocks = block_manager
        self.cache = prefix_cache
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self.max_model_len = max_model_len
        self.queue_key: QueueKey = fifo_key
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.paused = False
        self._admission_blocked = False
        self.num_prefill_tokens = 0
        self.num_reprefill_tokens = 0
        """Of those, tokens of requests imported from another engine (their prompt and
        outputs so far) that were computed again here: not served by a prefix cache."""
        """Tokens needing KV at each admission (re-admissions count again)."""
        self.num_cached_tokens = 0
        """Of those, tokens served from the prefix cache."""
        self.num_preemptions = 0
        self.cache_epoch = 0
        """Bumped by reset_prefix_cache: KV computed before (e.g. with old weights) is never cached."""

    # -- queue --------------------------------------------------------------------
    def check_fits(self, seq: Sequence) -> None:
        """Reject what could never run: its longest possible KV exceeds the whole cache."""
        sampling = seq.request.sampling
        # the last sampled token never gets KV
        longest = min(seq.num_prompt_tokens + sampling.max_new_tokens, self.max_model_len) - 1
        if seq.num_tokens > self.max_model_len:
            raise ValueError(f"request {seq.request_id!r}: {seq.num_tokens} tokens exceed "
                             f"max_model_len={self.max_model_len}")
        if self.blocks.blocks_for(longest) > self.blocks.num_blocks:
            raise ValueError(f"request {seq.request_id!r}: up to {longest} tokens of KV exceed the "
                             f"cache capacity of {self.blocks.capacity_tokens} tokens")

    def add(self, seq: Sequence) -> None:
        self.check_fits(seq)
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _sort_waiting(self) -> None:
        if self.queue_key is fifo_key:
            self.waiting.sort(key=lambda s: (s.request.arrival_time, s.order))
            return
        self.waiting.sort(key=lambda s: (self.queue_key(s.request, len(self._match(s, touch=False)) * self.blocks.block_size), s.order))

    def _match(self, seq: Sequence, touch: bool = True) -> list[int]:
        if self.cache is None:
            return []
        return self.cache.match_prefix(seq.token_ids[:seq.num_tokens - 1], touch=touch)

    # -- memory -------------------------------------------------------------------
    def _make_room(self, num_blocks: int) -> bool:
        short = num_blocks - self.blocks.num_free_blocks
        if short > 0 and self.cache is not None:
            evicted = self.cache.evict(short, lambda b: self.blocks.ref_count(b) == 1)
            self.blocks.free(evicted)
        return self.blocks.can_allocate(num_blocks)

    def _cache_computed(self, seq: Sequence) -> None:
        if self.cache is not None and seq.cache_epoch == self.cache_epoch:
            full = seq.num_computed_tokens // self.blocks.block_size
            kept = self.cache.insert(seq.token_ids[:seq.num_computed_tokens], seq.block_table[:full])
            self.blocks.incref(kept)

    def _release(self, seq: Sequence) -> None:
        """Give back a sequence's blocks; its full computed blocks stay in the prefix cache."""
        self._cache_computed(seq)
        self.blocks.free(seq.block_table)
        seq.block_table = []
        seq.num_computed_tokens = 0

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.WAITING
        self.waiting.append(seq)
        self.num_preemptions += 1
        self._admission_blocked = True

    # -- scheduling -----------------------------------------------------------------
    def schedule(self) -> Batch | None:
        if self.paused:
            return None
        if not self.running:
            self._admission_blocked = False
        batch = None if self._admission_blocked else self._schedule_prefill()
        return batch or self._schedule_decode()

    def _schedule_prefill(self) -> Batch | None:
        if not self.waiting:
            return None
        self._sort_waiting()
        admitted: list[Sequence] = []
        num_new_tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            seq = self.waiting[0]
            cached = self._match(seq)
            new_tokens = seq.num_tokens - len(cached) * self.blocks.block_size
            if admitted and num_new_tokens + new_tokens > self.max_prefill_tokens:
                break
            self.blocks.incref(cached)  # hold the matched prefix so making room cannot evict it
            needed = self.blocks.blocks_for(seq.num_tokens) - len(cached)
            if not self._make_room(needed):
                self.blocks.free(cached)
                break
            seq.block_table = cached + self.blocks.allocate(needed)
            seq.num_computed_tokens = seq.num_cached_tokens = len(cached) * self.blocks.block_size
            seq.status = Status.RUNNING
            seq.cache_epoch = self.cache_epoch
            self.num_prefill_tokens += seq.num_tokens
            self.num_cached_tokens += seq.num_cached_tokens
            if seq.imported:  # continued from another engine: what it computes again
                self.num_reprefill_tokens += new_tokens
                seq.imported = False
            num_new_tokens += new_tokens
            admitted.append(self.waiting.pop(0))
        if not admitted:
            return None
        self.running.extend(admitted)
        return Batch(admitted, is_prefill=True)

    def _schedule_decode(self) -> Batch | None:
        batch: list[Sequence] = []
        for seq in list(self.running):
            if seq.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            while len(seq.block_table) < self.blocks.blocks_for(seq.num_tokens):
                if self._make_room(1):
                    seq.block_table += self.blocks.allocate(1)
                else:
                    victim = self.running[-1]
                    self._preempt(victim)
                    if victim is seq:
                        break
            if seq.status is Status.RUNNING:
                batch.append(seq)
        return Batch(batch, is_prefill=False) if batch else None

    def postprocess(self, batch: Batch, token_ids: Seq[int], logprobs: Seq[float],
                    weight_version: int = 0) -> list[Sequence]:
        """Record one sampled token per sequence; returns the sequences that finished."""
        assert len(batch.seqs) == len(token_ids) == len(logprobs)
        finished = []
        for seq, token_id, logprob in zip(batch.seqs, token_ids, logprobs):
            seq.num_computed_tokens = seq.num_tokens
            if batch.is_prefill:
                self._cache_computed(seq)  # share the prompt with requests admitted later
            seq.append(int(token_id), float(logprob))
            seq.weight_version = weight_version
            reason = seq.check_finished(self.max_model_len)
            if reason is not None:
                self._finish(seq, reason)
                finished.append(seq)
        return finished

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.running.remove(seq)
        self._release(seq)
        seq.status = Status.FINISHED
        seq.finish_reason = reason
        self._admission_blocked = False

    # -- control ----------------------------------------------------------------
    def abort(self, request_ids: Seq[str]) -> list[Sequence]:
        wanted = set(request_ids)
        aborted = [s for s in self.running + self.waiting if s.request_id in wanted]
        for seq in aborted:
            if seq.status is Status.RUNNING:
                self._finish(seq, "abort")
            else:
                self.waiting.remove(seq)
                seq.status, seq.finish_reason = Status.FINISHED, "abort"
        return aborted

    def take_all(self) -> list[Sequence]:
        """Remove every unfinished sequence (running and waiting), in admission order."""
        for seq in self.running:
            self._release(seq)
            seq.status = Status.WAITING
        seqs = sorted(self.running + self.waiting, key=lambda s: s.order)
        self.running, self.waiting = [], []
        self._admission_blocked = False
        return seqs

    def cache_prefix(self, token_ids: Seq[int], fill: Callable[[list[int], int], None]) -> int:
        """Enter the full blocks of token_ids past the cached prefix into the prefix cache
        (a prefix computed elsewhere): blocks allocated, making room by eviction, and
        `fill(blocks, first)` writes their KV (blocks for full blocks first, first + 1, ...).
        Returns the tokens entered (0: no cache or no room)."""
        if self.cache is None:
            return 0
        bs = self.blocks.block_size
        full = len(token_ids) // bs
        have = self.cache.match_prefix(token_ids[:full * bs])
        need = full - len(have)
        if need <= 0:
            return 0
        self.blocks.incref(have)  # making room must not evict the prefix it extends
        try:
            if not self._make_room(need):
                return 0
            new = self.blocks.allocate(need)
            try:
                fill(new, len(have))
            except BaseException:
                self.blocks.free(new)
                raise
            kept = self.cache.insert(token_ids[:full * bs], have + new)  # the tree holds new's one reference
            self.blocks.free([b for b in new if b not in kept])
            return len(kept) * bs
        finally:
            self.blocks.free(have)

    def reset_prefix_cache(self) -> None:
        self.cache_epoch += 1
        if self.cache is not None:
            self.blocks.free(self.cache.reset())

    def active_kv_tokens(self) -> int:
        """Distinct tokens with KV held by running sequences (a shared prefix counts once)."""
        bs, seen, total = self.blocks.block_size, set(), 0
        for seq in self.running:
            for i, block in enumerate(seq.block_table):
                if block not in seen:
                    seen.add(block)
                    total += max(0, min(bs, seq.num_computed_tokens - i * bs))
        return total
