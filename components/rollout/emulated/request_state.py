"""One request inside the emulated engine: counts, not tokens."""
from __future__ import annotations

from functools import partial
from typing import Any

from dynarl.components.rollout.base import GenerationRequest, GenerationResult, InflightRequest

from dynarl.components.rollout.emulated.tokens import LazyList, request_seed, response_logprobs, response_tokens


class RequestState:
    """A request's state. While it runs, its output length is implied by the engine's
    step counter (out_base + steps since admission), so a decode step touches no
    sequence at all; ids are built only when someone needs them."""

    __slots__ = ("request", "order", "seed", "prompt_len", "target", "prior_ids", "prior_logprobs",
                 "out_base", "admit_step", "finish_step", "key", "hashes", "hash_epoch", "held",
                 "shared_tokens", "cached_tokens", "imported", "kv_tokens")

    def __init__(self, request: GenerationRequest, order: int,
                 prior_ids: list[int] | None = None, prior_logprobs: list[float] | None = None):
        self.request = request
        self.order = order
        """Admission sequence number: FIFO tie-break, and tells stale heap entries apart."""
        self.seed = request_seed(request)
        self.prompt_len = len(request.prompt_token_ids)
        self.target = request.sampling.max_new_tokens
        """The response is exactly this long (see engine module doc)."""
        self.prior_ids = prior_ids or []
        """Output tokens made elsewhere (import_inflight); kept verbatim."""
        self.prior_logprobs = prior_logprobs or []
        self.out_base = len(self.prior_ids)
        """Output tokens made before the current admission."""
        self.admit_step = -1
        """Engine step at admission; -1 while not running."""
        self.finish_step = -1
        self.key: Any = None
        self.hashes: list[int] = []
        """Prefix-cache keys of the prompt's full blocks, computed under `hash_epoch`."""
        self.hash_epoch = -1
        self.held: list[int] = []
        """Cache blocks this sequence pins while running."""
        self.shared_tokens = 0
        self.cached_tokens = 0
        self.imported = prior_ids is not None
        """Continued from another engine (import_inflight) and not admitted here yet:
        what its admission computes is counted as re-prefilled."""
        self.kv_tokens = 0
        """Tokens of KV that came with it from another engine (import_kv), used at its admission."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def num_output(self, step: int) -> int:
        return self.out_base + (step - self.admit_step if self.admit_step >= 0 else 0)

    def output_ids(self, n: int, vocab_size: int) -> list[int]:
        stops = self.request.sampling.stop_token_ids
        start = len(self.prior_ids)
        return self.prior_ids + response_tokens(self.seed, start, n, self.target, vocab_size, stops)

    def output_logprobs(self, n: int) -> list[float]:
        return self.prior_logprobs + response_logprobs(self.seed, len(self.prior_logprobs), n)

    def result(self, n: int, finish_reason: str, weight_version: int, vocab_size: int,
               output_ids: list[int] | None = None, lazy: bool = False) -> GenerationResult:
        if lazy:  # ids and log-probs built only if someone reads them (tokens.LazyList)
            ids = output_ids if output_ids is not None else LazyList(n, partial(self.output_ids, n, vocab_size))
            logprobs = LazyList(n, partial(self.output_logprobs, n))
        else:
            ids = self.output_ids(n, vocab_size) if output_ids is None else output_ids
            logprobs = self.output_logprobs(n)
        return GenerationResult(
            request_id=self.request_id,
            prompt_token_ids=list(self.request.prompt_token_ids),
            output_token_ids=ids,
            output_logprobs=logprobs,
            finish_reason=finish_reason,
            weight_version=weight_version,
            cached_tokens=self.cached_tokens,
        )

    def inflight(self, n: int, vocab_size: int) -> InflightRequest:
        return InflightRequest(self.request, self.output_ids(n, vocab_size), self.output_logprobs(n))
