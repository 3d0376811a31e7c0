"""Causal attention over packed sequences: several samples concatenated into one row
of T tokens, each attending only to its own earlier tokens.

The packing is given as `cu_seqlens` [N + 1] (int32 or int64): sample s occupies
positions cu_seqlens[s] .. cu_seqlens[s + 1] - 1, cu_seqlens[0] = 0 and
cu_seqlens[N] = T (the layout flash-attention's variable-length kernels take).

- On CUDA in fp16/bf16, torch's variable-length flash attention
  (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10) runs without a T x T mask.
  Written against its documented API; NOT verified on a GPU here.
- Elsewhere (CPU, fp32): SDPA over windows of whole consecutive samples, about
  WINDOW_TOKENS each (a longer sample is a window of its own), each with its own
  block-diagonal causal mask: ~T x WINDOW_TOKENS work, not T x T. (One T x T mask made
  the trainer's long-tailed micro-batches quadratic: 4096 packed tokens trained slower
  than 2048 twice; one call per sample made many short samples slow: 0.5 ms a call.)
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def segment_ids(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[T] long: the sample each position belongs to."""
    arange = torch.arange(length, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:].long(), arange, right=True)


def packed_positions(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[T] long: each position's index within its own sample (RoPE restarts at 0)."""
    arange = torch.arange(length, device=cu_seqlens.device)
    return arange - cu_seqlens.long()[segment_ids(cu_seqlens, length)]


WINDOW_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Window:
    start: int
    end: int
    mask: torch.Tensor
    """[end - start, end - start] bool: j <= i within the same sample."""


def windows(bounds: list[int], device: torch.device | str = "cpu", size: int = WINDOW_TOKENS) -> list[Window]:
    """The CPU path's windows of whole samples (`bounds`: cu_seqlens as a list): each at
    most `size` tokens, but a longer sample is a window of its own."""
    out: list[Window] = []

    def close(start: int, end: int) -> None:
        if end > start:
            local = torch.tensor([b - start for b in bounds if start <= b <= end], device=device)
            seg = segment_ids(local, end - start)
            causal = torch.ones(end - start, end - start, dtype=torch.bool, device=device).tril()
            out.append(Window(start, end, causal & (seg[:, None] == seg[None, :])))

    start = bounds[0]
    for prev, end in zip(bounds, bounds[1:]):
        if end - start > size and prev > start:  # this sample would overflow the window: it starts the next
            close(start, prev)
            start = prev
        if end - start >= size or end == bounds[-1]:
            close(start, end)
            start = end
    return out


def uses_varlen(q: torch.Tensor) -> bool:
    """Whether `packed_attention` takes the flash variable-length kernel for q."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, spans: list[Window] | None) -> torch.Tensor:
    """q [1, T, H, D], k/v [1, T, Hkv, D] -> [1, T, H, D], attention kept within each
    sample. `spans`: `windows(...)` (made once per forward by the caller) where
    `uses_varlen(q)` is false, else unused."""
    gqa = q.shape[2] != k.shape[2]
    if uses_varlen(q):
        from torch.nn.attention.varlen import varlen_attn
        cu = cu_seqlens.to(torch.int32)
        out = varlen_attn(q[0], k[0], v[0], cu, cu, max_seqlen, max_seqlen,
                          window_size=(-1, 0), enable_gqa=gqa)  # (-1, 0): causal
        return out.unsqueeze(0)
    assert spans is not None, "the CPU path needs the forward's windows"
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, H, T, D]
    out = torch.cat([F.scaled_dot_product_attention(q[:, :, w.start:w.end], k[:, :, w.start:w.end],
                                                    v[:, :, w.start:w.end], attn_mask=w.mask, enable_gqa=gqa)
                     for w in spans], dim=2)
    return out.transpose(1, 2)
