"""KV and queue bookkeeping of the emulated engine: which requests run, and what one step costs.

Plain Python, no time and no asyncio: the engine asks `schedule()` for a batch,
sleeps the cost of it, then calls `advance()`.

KV accounting, in tokens: capacity >= tokens private to running requests + every
block in the prefix cache (pinned by running requests or evictable). Prompt
blocks shared by several running requests (GRPO siblings) count once.
"""
from __future__ import annotations

import heapq
from typing import Any, Sequence

from dynarl.components.rollout.base import GenerationRequest, QueueKey

from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.prefix_cache import PrefixCache
from dynarl.components.rollout.emulated.request_state import RequestState

Finished = tuple[RequestState, int, "list[int] | None"]
"""(request, output length, output ids if already built)."""


class Scheduler:
    def __init__(self, config: EmulatedRolloutConfig, capacity: int, vocab_size: int):
        self.config = config
        self.capacity = capacity
        self.vocab_size = vocab_size
        self.cache = PrefixCache(config.block_size) if config.enable_prefix_cache else None
        self.cache_epoch = 0
        self.queue_key: QueueKey | None = None
        self.waiting: dict[str, RequestState] = {}
        self.running: dict[str, RequestState] = {}  # admission order: the last is preempted first
        self._queue: list[tuple[Any, int, str]] = []  # heap of (key, order, id); stale entries skipped
        self._finishes: list[tuple[int, int, str]] = []  # heap of (finish step, order, id)
        self._next_order = 0
        self.step = 0
        """Decode steps so far: a running request's output length is implied by it."""
        self.context_tokens = 0
        """Sum of prompt + output over running requests."""
        self.private_tokens = 0
        """Their tokens outside shared cache blocks."""
        self.cache_hit_tokens = 0
        self.num_preemptions = 0
        self.num_reprefill_tokens = 0
        """Tokens imported requests computed again at their admission here."""
        self._admission_blocked = False
        """Set by a preemption, cleared when a request finishes (or none runs): an
        engine short of KV does not admit new work only to preempt it again."""
        self._budget_limited = False
        """The last admission stopped at max_prefill_tokens: more fits next step."""

    # --- queue ---------------------------------------------------------------

    def check(self, request: GenerationRequest, seen: set[str]) -> None:
        rid = request.request_id
        if rid in self.waiting or rid in self.running or rid in seen:
            raise ValueError(f"request {rid} is already in this engine")
        seen.add(rid)
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid}: empty prompt")
        total = len(request.prompt_token_ids) + request.sampling.max_new_tokens
        if total > self.capacity:
            raise ValueError(f"request {rid}: prompt + max_new_tokens = {total} tokens exceeds the "
                             f"engine's KV capacity of {self.capacity} tokens")

    def new_state(self, request: GenerationRequest, prior_ids: list[int] | None = None,
                  prior_logprobs: list[float] | None = None) -> RequestState:
        self._next_order += 1
        return RequestState(request, self._next_order, prior_ids, prior_logprobs)

    def enqueue(self, state: RequestState) -> None:
        state.key = self._key(state)
        self.waiting[state.request_id] = state
        heapq.heappush(self._queue, (state.key, state.order, state.request_id))

    def set_queue_key(self, key: QueueKey | None) -> None:
        self.queue_key = key
        for state in self.waiting.values():
            state.key = self._key(state)
        self._queue = [(s.key, s.order, rid) for rid, s in self.waiting.items()]
        heapq.heapify(self._queue)

    def _key(self, state: RequestState) -> Any:
        if self.queue_key is None:
            return (state.request.arrival_time, state.order)
        return self.queue_key(state.request, self._match(state) * self.cache.block_size if self.cache else 0)

    def _hashes(self, state: RequestState) -> list[int]:
        """Keys of the full blocks of the request's known tokens: its prompt, plus its
        output when a preemption cached it."""
        if self.cache is None:
            return []
        if state.hash_epoch != self.cache_epoch:  # weights changed: old blocks must not match
            state.hashes = self.cache.extend_hashes([], state.request.prompt_token_ids, self.cache_epoch)
            state.hash_epoch = self.cache_epoch
        return state.hashes

    def _match(self, state: RequestState) -> int:
        """Cached leading blocks, leaving at least the last known token to compute
        (as the native scheduler does, so that its logits exist)."""
        context = state.prompt_len + state.out_base
        return min(self.cache.match(self._hashes(state)), (context - 1) // self.cache.block_size)

    def cached_prefix(self, token_ids: list[int]) -> int:
        """Tokens of the longest prefix of `token_ids` whose full blocks the prefix cache
        holds (computed with the current weights)."""
        if self.cache is None:
            return 0
        return self.cache.match(self.cache.extend_hashes([], token_ids, self.cache_epoch)) * self.cache.block_size

    # --- one step ---------------------------------------------------------------

    def used_tokens(self) -> int:
        return self.private_tokens + (self.cache.num_tokens if self.cache else 0)

    def active_kv_tokens(self) -> int:
        pinned = self.cache.num_tokens - self.cache.num_evictable_tokens if self.cache else 0
        return self.private_tokens + pinned

    def schedule(self) -> int:
        """Make room for this step's tokens, admit what fits; returns prompt tokens to prefill."""
        while self.running and not self.fits(len(self.running)):
            self._preempt(self.running[next(reversed(self.running))])
        if not self.running:
            self._admission_blocked = False
        return 0 if self._admission_blocked else self._admit()

    def fits(self, extra: int) -> bool:
        """Whether `extra` more tokens fit, evicting unpinned cache blocks if that helps."""
        short = self.used_tokens() + extra - self.capacity
        if short > 0 and self.cache:
            self.cache.evict(short)
        return self.used_tokens() + extra <= self.capacity

    def _admit(self) -> int:
        cache = self.cache
        bs = cache.block_size if cache else 0
        prefill = admitted = 0
        self._budget_limited = False
        while self._queue and len(self.running) < self.config.max_num_seqs:
            _, order, rid = self._queue[0]
            state = self.waiting.get(rid)
            if state is None or state.order != order:
                heapq.heappop(self._queue)
                continue
            context = state.prompt_len + state.out_base
            hashes = self._hashes(state)
            matched = self._match(state) if cache else 0
            cached = matched * bs
            if state.kv_tokens:  # moved here with its KV: all but its last token's block is in hand
                cached = max(cached, min(state.kv_tokens, (context - 1) // self.config.block_size
                                         * self.config.block_size))
            if admitted and prefill + context - cached > self.config.max_prefill_tokens:
                self._budget_limited = True
                break
            if cache:
                cache.acquire(hashes[:matched])  # pin the hit before evicting for room
            # its private tokens + new cache blocks + the token it writes this step,
            # on top of one token for each request already running
            if not self.fits(context - matched * bs + 1 + len(self.running)):
                if cache:
                    cache.release(hashes[:matched])
                break
            heapq.heappop(self._queue)
            del self.waiting[rid]
            if cache:
                cache.acquire(hashes[matched:])
            state.held = hashes
            state.shared_tokens = len(hashes) * bs
            state.cached_tokens = cached
            state.admit_step = self.step
            state.finish_step = self.step + state.target - state.out_base
            heapq.heappush(self._finishes, (state.finish_step, state.order, rid))
            self.running[rid] = state
            self.context_tokens += context
            self.private_tokens += context - state.shared_tokens
            self.cache_hit_tokens += matched * bs
            if state.imported:
                self.num_reprefill_tokens += context - cached
            state.imported, state.kv_tokens = False, 0  # in the pool now; a preemption loses it
            prefill += context - cached
            admitted += 1
        return prefill

    def steps_until_event(self) -> int:
        """Decode steps the running batch can take unchanged, with nothing to decide in
        between: up to the next finish, or the last step whose KV growth fits without a
        preemption; 1 if the queue admits more next step. (Admission cannot become
        possible otherwise: free KV only shrinks and max_num_seqs stays full until a
        finish.) External events cut a run short (EmulatedRolloutEngine._cut)."""
        if not self.running or (self.waiting and self._budget_limited):
            return 1
        pinned = self.cache.num_tokens - self.cache.num_evictable_tokens if self.cache else 0
        by_memory = (self.capacity - self.private_tokens - pinned) // len(self.running)
        return max(1, min(self._finishes[0][0] - self.step, by_memory))

    def advance(self, num_steps: int = 1) -> list[Finished]:
        """Every running request gained `num_steps` tokens; returns those now complete."""
        grown = len(self.running) * num_steps
        self.step += num_steps
        self.context_tokens += grown
        self.private_tokens += grown
        self.fits(0)  # unpinned blocks make way for the growth, as step by step
        out: list[Finished] = []
        while self._finishes and self._finishes[0][0] <= self.step:
            finish_step, order, rid = heapq.heappop(self._finishes)
            state = self.running.get(rid)
            if state is None or state.order != order or state.finish_step != finish_step:
                continue  # aborted, exported or preempted since
            n = self.stop_running(state)
            # Cache the whole turn, so the next turn of a multi-turn episode hits it.
            ids = self._cache_output(state, n)
            self.release(state)
            self._admission_blocked = False
            out.append((state, n, ids))
        return out

    def _cache_output(self, state: RequestState, n: int) -> list[int] | None:
        """Put the full blocks of prompt + n outputs in the cache (pinned until release());
        returns the output ids it had to build, or None."""
        if not self.cache or state.hash_epoch != self.cache_epoch:
            return None
        ids = state.output_ids(n, self.vocab_size)
        full = self.cache.extend_hashes(state.held, list(state.request.prompt_token_ids) + ids,
                                        self.cache_epoch)
        self.cache.acquire(full[len(state.held):])
        state.held = full
        state.hashes = full  # a preempted request re-admitted later matches its output too
        return ids

    # --- taking requests out ------------------------------------------------------

    def stop_running(self, state: RequestState) -> int:
        """Take a running request out of the batch (its blocks stay pinned until release());
        returns its output length."""
        n = state.num_output(self.step)
        context = state.prompt_len + n
        self.context_tokens -= context
        self.private_tokens -= context - state.shared_tokens
        del self.running[state.request_id]
        state.admit_step = -1
        state.out_base = n
        return n

    def release(self, state: RequestState) -> None:
        if self.cache:
            self.cache.release(state.held)
        state.held = []
        state.shared_tokens = 0

    def _preempt(self, state: RequestState) -> None:
        # Recompute-style: it keeps its output count and re-prefills prompt + output later.
        n = self.stop_running(state)
        self._cache_output(state, n)
        self.release(state)
        self.num_preemptions += 1
        self._admission_blocked = True
        self.waiting[state.request_id] = state  # same key and order: back to the front
        heapq.heappush(self._queue, (state.key, state.order, state.request_id))

    def remove(self, request_ids: Sequence[str]) -> list[tuple[RequestState, int]]:
        """Take the given requests out, running or waiting; unknown ids are skipped."""
        out = []
        for rid in request_ids:
            if (state := self.running.get(rid)) is not None:
                n = self.stop_running(state)
                self.release(state)
            elif (state := self.waiting.pop(rid, None)) is not None:
                n = state.out_base
            else:
                continue
            out.append((state, n))
        return out

    def flush_cache(self) -> None:
        """Drop unpinned blocks and stop pinned ones from matching (new weights)."""
        if self.cache:
            self.cache.evict_all()
            self.cache_epoch += 1
