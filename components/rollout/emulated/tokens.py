"""Synthetic output tokens: a pure function of (seed, position).

The emulated engine never holds per-token state while decoding, only counts.
Token ids and log-probs are made on demand (a request finishes, is exported or
aborted) from a hash of (seed, position), so a request continued on another
engine, or after a preemption, ends with exactly the ids of an uninterrupted run,
and building them is one vectorised numpy pass instead of a Python loop.
"""
from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Callable

import numpy as np

from dynarl.components.rollout.base import GenerationRequest

_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_TOKEN_SALT = 0x5851F42D4C957F2D
_LOGPROB_SALT = 0x14057B7EF767814F
MIN_LOGPROB = -4.0
"""Synthetic log-probs are spread over (MIN_LOGPROB, 0]."""


def request_seed(request: GenerationRequest) -> int:
    """The request's sampling seed, or a stable hash of its id (crc32: the same in every process)."""
    seed = request.sampling.seed
    return seed if seed is not None else zlib.crc32(request.request_id.encode())


def _splitmix(x: np.ndarray) -> np.ndarray:
    # splitmix64 finaliser; uint64 array arithmetic wraps modulo 2**64 as intended.
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _stream(seed: int, start: int, stop: int, salt: int) -> np.ndarray:
    base = np.uint64(((seed & _MASK) * 0xD1B54A32D192ED03 ^ salt) & _MASK)
    positions = np.arange(start, stop, dtype=np.uint64)
    return _splitmix(positions * _GOLDEN + base)


def response_tokens(seed: int, start: int, stop: int, length: int, vocab_size: int,
                    stop_token_ids: Sequence[int] = ()) -> list[int]:
    """Output token ids at positions [start, stop) of a response of `length` tokens.

    Without stop tokens every id is hashed from (seed, position). With stop tokens the
    last position holds stop_token_ids[0] and no earlier position holds any of them,
    so the response ends exactly at `length` either way.
    """
    if stop <= start:
        return []
    ids = (_stream(seed, start, stop, _TOKEN_SALT) % np.uint64(vocab_size)).astype(np.int64)
    if stop_token_ids:
        stops = np.asarray(stop_token_ids, dtype=np.int64)
        clash = np.isin(ids, stops)
        while clash.any():
            ids[clash] = (ids[clash] + 1) % vocab_size
            clash = np.isin(ids, stops)
        if start <= length - 1 < stop:
            ids[length - 1 - start] = stop_token_ids[0]
    return ids.tolist()


def response_logprobs(seed: int, start: int, stop: int) -> list[float]:
    """Log-probs at positions [start, stop), deterministic like the ids."""
    if stop <= start:
        return []
    unit = (_stream(seed, start, stop, _LOGPROB_SALT) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return (unit * MIN_LOGPROB).tolist()


class LazyList(Sequence):
    """A list built on first access: `len()` is known up front and costs nothing.

    With EmulatedRolloutConfig.lazy_outputs, results hold their output ids and
    log-probs as LazyLists, so a cluster-scale simulation that only needs response
    lengths never builds tens of millions of synthetic tokens. Values, once read,
    equal the eager ones. Materialize with list() before sending over the wire.
    """

    __slots__ = ("_length", "_build", "_items")

    def __init__(self, length: int, build: Callable[[], list]):
        self._length = length
        self._build = build
        self._items: list | None = None

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index):
        if self._items is None:
            self._items = self._build()
            assert len(self._items) == self._length, "LazyList built the wrong length"
        return self._items[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, (list, LazyList)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"LazyList(len={self._length}, built={self._items is not None})"
