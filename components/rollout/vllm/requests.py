"""Translating between dynarl's requests/results and vLLM's SamplingParams and
streamed RequestOutputs (vllm 0.32)."""
from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.rollout.base import GenerationRequest, GenerationResult

SEED_MASK = (1 << 63) - 1


class IdAllocator:
    """vLLM request ids: a random per-engine prefix and a counter, so an id is never
    reused within an engine (vLLM refuses a live duplicate) and a request that moved
    here from another engine gets an id of this engine's own."""

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self.prefix}-{next(self._counter):x}"


@dataclass(slots=True)
class Entry:
    """One request in this engine. `prior_*`: tokens generated elsewhere before it was
    imported (Workload migration); `ids`/`logprobs`: those vLLM has streamed back here."""
    request: GenerationRequest
    vid: str
    prior_ids: list[int] = field(default_factory=list)
    prior_logprobs: list[float] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    submitted: bool = False
    """Handed to vLLM (past our gate)."""
    task: Any = None

    def remaining(self) -> int:
        return remaining_tokens(self)

    def output_ids(self) -> list[int]:
        return self.prior_ids + self.ids

    def output_logprobs(self) -> list[float]:
        return self.prior_logprobs + self.logprobs


def remaining_tokens(entry: Entry) -> int:
    return entry.request.sampling.max_new_tokens - len(entry.prior_ids) - len(entry.ids)


def continued_seed(seed: int, done: int) -> int:
    """The seed of a request continued after `done` tokens made elsewhere. vLLM seeds one
    generator per request (not per output position, as the native engine does), so a
    moved request cannot draw the tokens an uninterrupted run would; this keeps its
    continuation reproducible for a given split."""
    return seed if done == 0 else (seed * 1_000_003 + done) & SEED_MASK


def sampling_kwargs(entry: Entry) -> dict[str, Any]:
    """vllm.SamplingParams keywords (output_kind DELTA is added by the engine)."""
    s = entry.request.sampling
    kwargs: dict[str, Any] = {
        "max_tokens": remaining_tokens(entry), "temperature": s.temperature, "top_p": s.top_p,
        "top_k": s.top_k if s.top_k > 0 else 0,  # vLLM: 0 (or -1) disables top-k
        # the sampled token's logprob only; dynarl stops only on the listed ids (as the
        # native engine does) and keeps the stop token: it is part of the trained response
        "logprobs": 0, "ignore_eos": True, "detokenize": False, "skip_special_tokens": False,
    }
    if s.stop_token_ids:
        kwargs["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        kwargs["seed"] = continued_seed(s.seed, len(entry.prior_ids))
    return kwargs


def take_delta(entry: Entry, completion: Any) -> None:
    """Append one streamed DELTA CompletionOutput's tokens and their logprobs."""
    ids = list(completion.token_ids)
    if not ids:
        return
    logprobs = completion.logprobs
    if logprobs is None or len(logprobs) != len(ids):
        raise RuntimeError(f"request {entry.request.request_id}: {len(ids)} new tokens but "
                           f"{0 if logprobs is None else len(logprobs)} logprobs from vLLM")
    entry.ids.extend(ids)
    entry.logprobs.extend(float(step[token].logprob) for token, step in zip(ids, logprobs))


def finish_reason(reason: str | None) -> str:
    if reason not in ("stop", "length", "abort"):
        raise RuntimeError(f"unexpected vLLM finish_reason {reason!r}")
    return reason


def result(entry: Entry, reason: str, weight_version: int, cached_tokens: int = 0) -> GenerationResult:
    """The request's result so far (imported tokens count as output too); cached_tokens:
    prompt tokens vLLM's prefix cache served."""
    return GenerationResult(
        request_id=entry.request.request_id, prompt_token_ids=list(entry.request.prompt_token_ids),
        output_token_ids=entry.output_ids(), output_logprobs=entry.output_logprobs(),
        finish_reason=reason, weight_version=weight_version, cached_tokens=cached_tokens)
