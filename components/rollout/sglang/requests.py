"""Translating between dynarl's requests/results and SGLang's generate arguments and
output dicts (sglang 0.5.23, docs/BACKENDS.md A3, A4)."""
from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.rollout.base import GenerationRequest, GenerationResult


class RidAllocator:
    """SGLang's scheduler aborts every request whose rid *starts with* the given one.
    All rids here have the same length (a random per-engine prefix and a fixed-width
    counter), so a prefix match is an exact match; the random prefix keeps rids unique
    when a request moves to another engine."""

    def __init__(self) -> None:
        self.prefix = secrets.token_hex(8)
        self._counter = itertools.count()

    def next(self) -> str:
        return f"{self.prefix}{next(self._counter):016x}"


@dataclass(slots=True)
class Entry:
    """One request in this engine. `prior_*` are tokens generated elsewhere before it
    was imported (Workload migration): SGLang continues after them."""
    request: GenerationRequest
    rid: str
    prior_ids: list[int] = field(default_factory=list)
    prior_logprobs: list[float] = field(default_factory=list)
    submitted: bool = False
    """Handed to SGLang (past our pause gate)."""
    task: Any = None

    def remaining(self) -> int:
        return remaining_tokens(self)


def remaining_tokens(entry: Entry) -> int:
    return entry.request.sampling.max_new_tokens - len(entry.prior_ids)


def generate_kwargs(entry: Entry, priority: int | None) -> dict[str, Any]:
    """Keyword arguments of `Engine.async_generate` for this entry."""
    s = entry.request.sampling
    params: dict[str, Any] = {
        "max_new_tokens": remaining_tokens(entry), "temperature": s.temperature, "top_p": s.top_p,
        # dynarl stops only on the listed ids (as the native engine does) and keeps the
        # stop token in the output: it is part of the trained response. SGLang's
        # ignore_eos skips stop_token_ids too, so it is on only when none is listed;
        # a stop on the model's own EOS ids that are not listed is continued past
        # (stopped_off_list, SGLangRolloutEngine._run)
        "ignore_eos": not s.stop_token_ids, "no_stop_trim": True,
    }
    if s.top_k > 0:
        params["top_k"] = s.top_k
    if s.stop_token_ids:
        params["stop_token_ids"] = list(s.stop_token_ids)
    if s.seed is not None:
        params["sampling_seed"] = s.seed
    return {"input_ids": list(entry.request.prompt_token_ids) + list(entry.prior_ids),
            "sampling_params": params, "return_logprob": True, "rid": entry.rid, "priority": priority}


def result_from_output(entry: Entry, out: dict[str, Any], weight_version: int) -> GenerationResult:
    """SGLang's output dict {"output_ids", "meta_info"} -> a GenerationResult that
    counts the imported tokens as output too."""
    meta = out["meta_info"]
    reason = finish_reason(meta.get("finish_reason"))
    ids = list(out["output_ids"])
    # (logprob, token_id, text) per output token
    logprobs = [float(x[0]) for x in meta.get("output_token_logprobs") or []]
    if len(logprobs) != len(ids):
        if reason != "abort":
            raise RuntimeError(f"request {entry.request.request_id}: {len(ids)} output ids but "
                               f"{len(logprobs)} logprobs (was return_logprob dropped?)")
        # an aborted request reports what reached the TokenizerManager; keep the part
        # both lists cover, a consistent prefix that an import continues from
        ids = ids[:len(logprobs)]
        logprobs = logprobs[:len(ids)]
    return GenerationResult(
        request_id=entry.request.request_id, prompt_token_ids=list(entry.request.prompt_token_ids),
        output_token_ids=entry.prior_ids + ids, output_logprobs=entry.prior_logprobs + logprobs,
        finish_reason=reason, weight_version=weight_version,
        cached_tokens=int(meta.get("cached_tokens", 0)))


def stopped_off_list(entry: Entry, result: GenerationResult) -> bool:
    """SGLang stopped on a token the request does not list (the model's EOS)."""
    return (result.finish_reason == "stop" and bool(result.output_token_ids)
            and result.output_token_ids[-1] not in entry.request.sampling.stop_token_ids)


def continue_after(entry: Entry, result: GenerationResult) -> None:
    """The entry goes on from `result`'s tokens, as an imported request does."""
    entry.prior_ids, entry.prior_logprobs = list(result.output_token_ids), list(result.output_logprobs)


def finish_reason(reason: dict[str, Any] | None) -> str:
    kind = (reason or {}).get("type")
    if kind not in ("stop", "length", "abort"):
        raise RuntimeError(f"unexpected SGLang finish_reason {reason!r}")
    return kind


def local_result(entry: Entry, reason: str, weight_version: int) -> GenerationResult:
    """A result for a request SGLang never saw (complete on import, or aborted while
    waiting at our gate)."""
    return GenerationResult(
        request_id=entry.request.request_id, prompt_token_ids=list(entry.request.prompt_token_ids),
        output_token_ids=list(entry.prior_ids), output_logprobs=list(entry.prior_logprobs),
        finish_reason=reason, weight_version=weight_version)
