"""Causal attention over packed sequences: several samples concatenated into one row
of T tokens, each attending only to its own earlier tokens.

The packing is given as `cu_seqlens` [N + 1] (int32 or int64): sample s occupies
positions cu_seqlens[s] .. cu_seqlens[s + 1] - 1, cu_seqlens[0] = 0 and
cu_seqlens[N] = T (the layout flash-attention's variable-length kernels take).

- On CUDA in fp16/bf16, torch's variable-length flash attention
  (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.10) runs without a T x T mask.
  Written against its documented API; NOT verified on a GPU here.
- Elsewhere (CPU, fp32): SDPA with a block-diagonal causal bool mask of T x T.
"""
from __future__ import annotations

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


def block_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """[T, T] bool, True where query i may attend key j: j <= i in the same sample."""
    seg = segment_ids(cu_seqlens, length)
    causal = torch.ones(length, length, dtype=torch.bool, device=cu_seqlens.device).tril()
    return causal & (seg[:, None] == seg[None, :])


def uses_varlen(q: torch.Tensor) -> bool:
    """Whether `packed_attention` takes the flash variable-length kernel for q."""
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_seqlen: int, mask: torch.Tensor | None) -> torch.Tensor:
    """q [1, T, H, D], k/v [1, T, Hkv, D] -> [1, T, H, D], attention kept within each
    sample. `mask` is `block_causal_mask` (built once per forward by the caller) where
    `uses_varlen(q)` is false, else unused."""
    gqa = q.shape[2] != k.shape[2]
    if uses_varlen(q):
        from torch.nn.attention.varlen import varlen_attn
        cu = cu_seqlens.to(torch.int32)
        out = varlen_attn(q[0], k[0], v[0], cu, cu, max_seqlen, max_seqlen,
                          window_size=(-1, 0), enable_gqa=gqa)  # (-1, 0): causal
        return out.unsqueeze(0)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, enable_gqa=gqa)
    return out.transpose(1, 2)
