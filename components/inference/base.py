"""What every inference engine (native, emulated) does: the log-probs of given
responses under the current policy, or under the frozen reference policy.

Every call that computes or moves weights is a coroutine (a native engine runs its
torch work in a thread; an emulated one spends cost-model time on the loop).
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence


class InferenceEngine(Protocol):
    weight_version: int
    """-1 until the first weight update."""
    @property
    def weights_template(self) -> Any:
        """The module weight_sync.receive plans its buckets from; None when the engine
        takes weights as a byte count (emulated)."""

    async def logprobs(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], *,
                       reference: bool = False) -> Sequence[Sequence[float]]:
        """One log-prob per response token, per response (the reference policy's with
        `reference`)."""
    async def update_weights(self, named_tensors: Any, version: int) -> None: ...
    async def load_reference(self, path: str) -> None: ...
    async def onload(self) -> None: ...
    async def offload(self) -> None: ...
