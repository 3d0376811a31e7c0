"""run.log_samples: a few of each step's trained samples as text, for people (the
dashboard's samples browser), beside samples.jsonl's token ids (run.save_samples).

One line of samples_text.jsonl per step:

    {"step": 3, "samples": [{"id", "group", "problem", "answer", "prompt", "response",
                             "reward", "advantage", "finish", "version", "tokens",
                             "logprobs", "old_logprobs", "turns"}, ...]}

`tokens` is each response token decoded alone and `logprobs` the rollout's sampling
log-prob of each (`old_logprobs`: inference's, of the trained policy; None where not
computed). A multi-turn sample's `turns` are its runs of model tokens (mask 1) and tool
observations (mask 0) as text; None for a single-turn sample.
"""
from __future__ import annotations

from typing import Any, Sequence

from dynarl.components.experience import PromptGroup, Sample

TEXT_FILE = "samples_text.jsonl"


def picked(total: int, n: int) -> list[int]:
    """`n` indexes spread evenly over `total` (all of them when n >= total): the
    samples logged are not only the first group's."""
    if n >= total:
        return list(range(total))
    return [i * total // n for i in range(n)]


def turns(output_ids: Sequence[int], mask: Sequence[int] | None, decode: Any) -> list[dict[str, str]] | None:
    """The response's runs of one kind, in order: {"role": "model" | "tool", "text"};
    None without a mask (single turn)."""
    if mask is None:
        return None
    out: list[dict[str, str]] = []
    start = 0
    for i in range(1, len(output_ids) + 1):
        if i == len(output_ids) or mask[i] != mask[start]:
            out.append({"role": "model" if mask[start] else "tool", "text": decode(list(output_ids[start:i]))})
            start = i
    return out


def decoder(tokenizer: Any) -> Any:
    """ids -> text, special tokens shown; an id the tokenizer cannot spell (a model whose
    vocabulary is larger than its tokenizer's samples one) as <id N>: a log never stops the run."""
    def one(i: int) -> str:
        try:
            return tokenizer.decode([i], skip_special=False)
        except (IndexError, KeyError, ValueError, OverflowError):
            return f"<id {i}>"

    def decode(ids: list[int]) -> str:
        try:
            return tokenizer.decode(ids, skip_special=False)
        except (IndexError, KeyError, ValueError, OverflowError):
            return "".join(one(i) for i in ids)
    return decode


def sample_text(group: PromptGroup, sample: Sample, tokenizer: Any) -> dict[str, Any]:
    """One sample as text (samples_text.jsonl's record)."""
    out = [int(t) for t in sample.output_ids]
    decode = decoder(tokenizer)
    return {"id": sample.id, "group": int(group.index), "problem": group.problem, "answer": group.answer,
            "prompt": decode([int(t) for t in group.prompt_ids]), "response": decode(out),
            "reward": None if sample.reward is None else float(sample.reward),
            "advantage": None if sample.advantage is None else float(sample.advantage),
            "finish": str(sample.finish), "version": int(sample.version),
            "tokens": [decode([t]) for t in out],
            "logprobs": [float(x) for x in sample.logprobs] if len(sample.logprobs) == len(out) else None,
            "old_logprobs": [float(x) for x in sample.old_logprobs] if sample.old_logprobs is not None else None,
            "turns": turns(out, sample.mask, decode)}


def step_samples(step: int, groups: Sequence[PromptGroup], tokenizer: Any, n: int) -> dict[str, Any]:
    """A step's samples_text.jsonl line: `n` of its samples, spread over the batch in its
    canonical order (groups by index)."""
    pairs = [(g, s) for g in sorted(groups, key=lambda g: g.index) for s in g.samples]
    return {"step": step, "samples": [sample_text(*pairs[i], tokenizer) for i in picked(len(pairs), n)]}
