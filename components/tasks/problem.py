"""A problem: one prompt with its verifiable answer, named by a stable id."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    id: str
    """Stable across runs and placement modes: "cu-17" (built-in), "e0:r42" (dataset epoch 0, row 42)."""
    prompt: str
    answer: str
    metadata: dict | None = None
    """A dataset row's fields other than its prompt and answer (dataset.py), for a reward
    function (reward.function); None for the built-in tasks."""


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (blake2b of their text): the same on every
    machine and process, unlike hash()."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)
