"""One multi-turn episode: its state, its wire form when carried to a later step, its
limits, and `next_action`, the pure decision after each turn (the loop that runs many
at once is episodes.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from dynarl.components.tasks.tool_syntax import Answer, Call, Malformed
from dynarl.core.data_router import ItemStatus


@dataclass(slots=True)
class Episode:
    id: str
    prompt_ids: list[int]
    seed: int
    response: list[int] = field(default_factory=list)
    """Every token after the prompt: model turns and observations."""
    mask: list[int] = field(default_factory=list)
    """Per response token: 1 = the model's (in the loss), 0 = an observation."""
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    malformed: int = 0
    tool_errors: int = 0
    answer: str = ""
    finish: str = ""
    """How the episode ended: 'answer', 'turn_cap', 'length' (context budget)."""
    version: int = -1
    group: int | None = None
    """Its prompt group: the group's episodes start on one rank (the prompt computed once)."""
    status: ItemStatus = field(default_factory=ItemStatus)
    computed: int = 0
    """Context tokens whose KV the last serving engine computed (prompt + model turns)."""
    segments: list[list[int]] = field(default_factory=list)
    """[first, end, weight version] of each run of response tokens one policy made."""
    pending: list | None = None
    """Partial rollout: the turn it was in when its step closed, [tokens so far, their
    log-probs, runs]: runs = [[end, version], ...], the weights that made each run of
    those tokens (a turn may be cut more than once); its next route continues it."""

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.response

    @property
    def oldest(self) -> int:
        """The oldest weights that made any of its tokens (its version, -1: none made)."""
        versions = [v for _, _, v in self.segments] + [v for _, v in (self.pending[2] if self.pending else ())]
        return min(versions, default=self.version)

    def pending_segments(self, start: int) -> list[list[int]]:
        """The cut turn's runs as [first, end, version] from response position `start`."""
        out, first = [], 0
        for end, version in self.pending[2] if self.pending else ():
            if end > first:
                out.append([start + first, start + end, int(version)])
            first = end
        return out

    def state(self) -> "EpisodeState":
        return EpisodeState(self.turns, self.tool_calls, self.malformed, self.tool_errors, self.pending)

    @classmethod
    def resume(cls, id: str, prompt_ids: list[int], seed: int, group: int | None, response: list[int],
               mask: list[int], logprobs: list[float], segments: list[list[int]] | None,
               state: "EpisodeState") -> "Episode":
        """An episode carried unfinished from an earlier step, as its sample kept it."""
        return cls(id, prompt_ids, seed, list(response), list(mask), list(logprobs), state.turns, state.tool_calls,
                   state.malformed, state.tool_errors, group=group, segments=[list(x) for x in segments or ()],
                   pending=state.pending,  # (its KV, the cut turn's included, was an earlier step's)
                   computed=len(prompt_ids) + len(response) + len(state.pending[0] if state.pending else ()))


@dataclass(frozen=True, slots=True)
class EpisodeState:
    """What a carried episode's sample keeps beyond its tokens, mask and segments
    (Sample.episode, msgpack- and JSON-safe as its wire list)."""
    turns: int
    tool_calls: int
    malformed: int
    tool_errors: int
    pending: list | None
    """[tokens so far, log-probs, [[end, version], ...]] of the turn it was in, or None
    (between turns)."""

    def to_wire(self) -> list:
        return [self.turns, self.tool_calls, self.malformed, self.tool_errors, self.pending]

    @classmethod
    def from_wire(cls, values: list) -> "EpisodeState":
        if not isinstance(values, list) or len(values) != 5 or not all(isinstance(v, int) for v in values[:4]):
            raise ValueError(f"an episode's state is [turns, tool_calls, malformed, tool_errors, pending], "
                             f"got {values!r}")
        pending = values[4]
        if pending is not None and (not isinstance(pending, list) or len(pending) != 3
                                    or not isinstance(pending[2], list)
                                    or not all(isinstance(r, list) and len(r) == 2 for r in pending[2])):
            raise ValueError(f"an episode's pending turn is [tokens, logprobs, runs], got {pending!r}")
        return cls(*values)


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int
    max_new_tokens: int
    """Per turn."""
    max_context: int
    """Prompt + response tokens, at most (the model's positions)."""
    max_observation_chars: int = 24


def next_action(reply: Call | Answer | Malformed, turns: int, context_len: int, limits: Limits) -> str:
    """What an episode does after a turn: 'answer' | 'call' | 'malformed' | 'turn_cap' | 'length'.
    A call or a malformed turn continues only when another turn fits."""
    if isinstance(reply, Answer):
        return "answer"
    if turns >= limits.max_turns:
        return "turn_cap"
    if context_len + limits.max_observation_chars + 2 > limits.max_context:
        return "length"
    return "call" if isinstance(reply, Call) else "malformed"
