"""ZeRO-1 layout: which data-parallel rank owns which part of the flat parameter space.

All parameters, in a fixed order, are concatenated into one flat vector of
`total` elements. Rank r of W owns the contiguous range [start_r, end_r) with

    size_r  = total // W + (1 if r < total % W else 0)
    start_r = size_0 + ... + size_{r-1}

so the ranges tile [0, total) exactly once and sizes differ by at most one
element. A range may cut through a parameter; nothing here cares about
parameter boundaries, which keeps the balance perfect.

The range functions are pure Python; `flatten`/`unflatten_into` move tensors
in and out of the flat space.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from dynarl.components.trainer.base import shard_ranges  # noqa: F401  (re-exported)


def overlaps(ranges: Sequence[tuple[int, int]], start: int, end: int) -> list[tuple[int, int, int]]:
    """The pieces of [start, end) held by each range: (rank, lo, hi) in flat coordinates,
    in flat order, empty pieces left out. Used to re-slice a checkpoint (or a state
    shard) written under one world size for a rank of another."""
    pieces = []
    for rank, (r_start, r_end) in enumerate(ranges):
        lo, hi = max(start, r_start), min(end, r_end)
        if lo < hi:
            pieces.append((rank, lo, hi))
    return pieces


def param_pieces(offsets: Sequence[int], numels: Sequence[int], start: int, end: int
                 ) -> list[tuple[int, int, int]]:
    """The parameters that [start, end) touches: (param index, lo, hi) with lo/hi in
    that parameter's own flattened coordinates."""
    pieces = []
    for index, (offset, numel) in enumerate(zip(offsets, numels)):
        lo, hi = max(start, offset), min(end, offset + numel)
        if lo < hi:
            pieces.append((index, lo - offset, hi - offset))
    return pieces


def flatten(tensors: Iterable[torch.Tensor | None], numels: Sequence[int],
            dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    """Concatenate tensors (None counts as zeros of its numel) into one flat `dtype` vector."""
    parts = [torch.zeros(n, dtype=dtype, device=device) if t is None else t.reshape(-1).to(dtype)
             for t, n in zip(tensors, numels, strict=True)]
    if not parts:
        return torch.zeros(0, dtype=dtype, device=device)
    return torch.cat(parts)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor], offsets: Sequence[int]) -> None:
    """Copy slices of `flat` into `tensors` in place (casting to each tensor's dtype)."""
    for t, offset in zip(tensors, offsets, strict=True):
        t.copy_(flat[offset:offset + t.numel()].view(t.shape))
