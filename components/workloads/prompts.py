"""A simulated workload's batches as the GRPO workflow's prompt groups.

Each group holds synthetic prompt ids of the workload's prompt length (one list,
shared by its samples) and samples that carry their response length as
"max_new_tokens": the emulated rollout engine makes exactly that many tokens, so
requests carry lengths, not text. Ids are a pure function of the prompt's id, so
every policy of a run sees the same requests. A sample's id names its step too: a
trace's requests come round again in later steps, and each is a new sample there.
"""
from __future__ import annotations

import zlib
from typing import Any, Callable

from dynarl.components.experience import PromptGroup, Sample
from dynarl.components.rollout.emulated.tokens import response_tokens
from dynarl.components.workloads.samples import Group


class WorkloadPrompts:
    stop_token_ids: tuple[int, ...] = ()
    """Responses end at their length (finish 'length'), never on a stop token."""

    def __init__(self, batches: list[list[Group]] | Callable[[int], list[Group]], vocab_size: int) -> None:
        """`batches`: step -> its batch (a list: the steps it holds)."""
        self.batch = batches.__getitem__ if isinstance(batches, list) else batches
        self.vocab_size = vocab_size

    def groups(self, step: int) -> list[PromptGroup]:
        """Step `step`'s groups (experience.py's PromptGroups)."""
        out = []
        for index, group in enumerate(self.batch(step)):
            prompt = token_ids(group.prompt_id, group.prompt_tokens, self.vocab_size)
            out.append(PromptGroup(index, group.prompt_id, "", prompt, [sample(step, s) for s in group.samples]))
        return out


def sample(step: int, s: Any) -> Sample:
    """A single-turn sample carries its length; a multi-turn one its script (the
    agentic workflow's ScriptedTurns): [[gen_tokens, tool_latency_s, obs_tokens], ...]."""
    out = Sample(f"{step}:{s.sample_id}", zlib.crc32(s.sample_id.encode()))
    if s.is_multi_turn:
        out.turns = [[t.gen_tokens, t.tool_latency_s, t.obs_tokens] for t in s.turns]
    else:
        out.max_new_tokens = s.response_tokens
    return out


def token_ids(key: str, length: int, vocab: int) -> list[int]:
    """Deterministic synthetic ids for a prompt (or a tool output) named `key`."""
    return response_tokens(zlib.crc32(key.encode()) ^ 0x7F4A7C15, 0, length, length, vocab)
