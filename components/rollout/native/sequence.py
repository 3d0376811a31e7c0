"""One request's state inside the native engine. Plain Python."""
from __future__ import annotations

from enum import Enum, auto

from dynarl.components.rollout.base import GenerationRequest


class Status(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """token_ids = prompt + outputs so far. KV exists for the first num_computed_tokens of
    them; the last sampled token gets its KV in the next decode step."""

    __slots__ = ("request", "order", "token_ids", "num_prompt_tokens", "output_logprobs", "block_table",
                 "num_computed_tokens", "num_cached_tokens", "cache_epoch", "status", "finish_reason",
                 "weight_version", "imported")

    def __init__(self, request: GenerationRequest, order: int,
                 output_token_ids: list[int] | None = None, output_logprobs: list[float] | None = None):
        outputs = list(output_token_ids or [])
        if len(outputs) != len(output_logprobs or []):
            raise ValueError("output_token_ids and output_logprobs must have the same length")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.request_id!r}: prompt_token_ids must not be empty")
        self.request = request
        self.order = order
        """Admission sequence number: the FIFO tie-breaker."""
        self.token_ids = list(request.prompt_token_ids) + outputs
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.output_logprobs = list(output_logprobs or [])
        self.block_table: list[int] = []
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        """Tokens served from the prefix cache at the last admission."""
        self.cache_epoch = -1
        """Prefix-cache generation at admission; KV from an older one is not cached."""
        self.status = Status.WAITING
        self.finish_reason: str | None = None
        self.weight_version = -1
        self.imported = False
        """Continued from another engine and not yet admitted here."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    def append(self, token_id: int, logprob: float) -> None:
        self.token_ids.append(token_id)
        self.output_logprobs.append(logprob)

    def check_finished(self, max_model_len: int) -> str | None:
        """'stop' if the last output is a stop token, 'length' if no more may be generated."""
        sampling = self.request.sampling
        if self.num_output_tokens and self.token_ids[-1] in sampling.stop_token_ids:
            return "stop"
        if self.num_output_tokens >= sampling.max_new_tokens or self.num_tokens >= max_model_len:
            return "length"
        return None
