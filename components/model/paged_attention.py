"""Attention over a block (paged) KV cache, in plain torch.

Layout: the cache of each layer is `[num_blocks, block_size, num_kv_heads, head_dim]`;
token position p of a sequence lives in block `block_table[p // block_size]` at
offset `p % block_size` (its "slot" is `block * block_size + offset`).

A step runs a batch of B sequences whose new tokens are packed into N rows (a
prefill: many tokens per sequence; a decode: one each). Linear layers run on the
packed rows; attention pads the queries to [B, Tq] and reads each sequence's keys
through its block table, so one batched matmul serves every sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class KVCache:
    k: torch.Tensor
    """[num_layers, num_blocks, block_size, num_kv_heads, head_dim]"""
    v: torch.Tensor

    @classmethod
    def allocate(cls, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 zeroed: bool = True) -> "KVCache":
        """`zeroed` False: uninitialised; the owner zeroes each block before its first
        use (attention reads a partly filled block's unused slots, masked, and a masked
        NaN still makes NaN: 0 x NaN), so untouched blocks cost no memory."""
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        make = torch.zeros if zeroed else torch.empty
        return cls(make(shape, dtype=dtype, device=device), make(shape, dtype=dtype, device=device))

    @property
    def block_size(self) -> int:
        return self.k.shape[2]


@dataclass(slots=True)
class PagedContext:
    positions: torch.Tensor
    """[N] position of each packed new token in its sequence."""
    slot_mapping: torch.Tensor
    """[N] cache slot each new token's K/V is written to."""
    block_tables: torch.Tensor
    """[B, max_blocks] padded with block 0 (masked out by position)."""
    query_index: torch.Tensor
    """[B, Tq] packed row of each padded query (pads point at row 0, their output is dropped)."""
    output_index: torch.Tensor
    """[N] flat index into B*Tq of each packed row."""
    attn_mask: torch.Tensor
    """[B, 1, Tq, S] True where a query may attend a key: key position <= query position."""
    last_index: torch.Tensor
    """[B] packed row of each sequence's last new token (its logits pick the next token)."""
    is_decode: bool = False
    """One new token per sequence: packed rows are the batch rows, no index needed."""

    @classmethod
    def build(cls, num_new_tokens: list[int], context_lens: list[int], block_tables: list[list[int]],
              block_size: int, device: str | torch.device = "cpu") -> "PagedContext":
        """Sequence b has `context_lens[b]` tokens after this step, the last `num_new_tokens[b]`
        of them computed now (the others already sit in the cache)."""
        num_seqs = len(num_new_tokens)
        assert num_seqs == len(context_lens) == len(block_tables) and num_seqs > 0
        max_new, max_blocks = max(num_new_tokens), max(len(t) for t in block_tables)
        new = torch.tensor(num_new_tokens, dtype=torch.long)
        ctx = torch.tensor(context_lens, dtype=torch.long)
        assert bool((new >= 1).all()) and bool((new <= ctx).all())
        tables = torch.zeros(num_seqs, max_blocks, dtype=torch.long)
        for b, table in enumerate(block_tables):
            tables[b, :len(table)] = torch.tensor(table, dtype=torch.long)
        t = torch.arange(max_new)
        valid = t[None, :] < new[:, None]                                   # [B, Tq]
        query_pos = torch.where(valid, ctx[:, None] - new[:, None] + t[None, :], 0)
        starts = torch.cumsum(new, 0) - new
        query_index = torch.where(valid, starts[:, None] + t[None, :], 0)
        flat = torch.arange(num_seqs * max_new).view(num_seqs, max_new)
        output_index = flat[valid]                                          # row-major = packed order
        positions = query_pos[valid]
        seq_of_row = torch.arange(num_seqs)[:, None].expand(num_seqs, max_new)[valid]
        blocks = tables[seq_of_row, positions // block_size]
        assert bool((positions // block_size < torch.tensor([len(x) for x in block_tables])[seq_of_row]).all())
        slot_mapping = blocks * block_size + positions % block_size
        key_pos = torch.arange(max_blocks * block_size)
        attn_mask = (key_pos[None, None, :] <= query_pos[:, :, None]).unsqueeze(1)
        return cls(positions=positions.to(device), slot_mapping=slot_mapping.to(device),
                   block_tables=tables.to(device), query_index=query_index.to(device),
                   output_index=output_index.to(device), attn_mask=attn_mask.to(device),
                   last_index=(starts + new - 1).to(device))


def build_decode_context(context_lens: list[int], block_tables: list[list[int]], block_size: int,
                         device: str | torch.device = "cpu") -> PagedContext:
    """PagedContext.build for one new token per sequence, in plain Python lists: the
    decode step runs every iteration, so its setup cost matters."""
    num_seqs = len(context_lens)
    max_blocks = max(len(t) for t in block_tables)
    positions = [n - 1 for n in context_lens]
    slots = [t[p // block_size] * block_size + p % block_size for t, p in zip(block_tables, positions)]
    tables = torch.tensor([t + [0] * (max_blocks - len(t)) for t in block_tables], dtype=torch.long)
    pos = torch.tensor(positions, dtype=torch.long)
    attn_mask = (torch.arange(max_blocks * block_size)[None, :] <= pos[:, None])[:, None, None, :]
    rows = torch.arange(num_seqs, device=device)
    return PagedContext(positions=pos.to(device), slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
                        block_tables=tables.to(device), query_index=rows[:, None], output_index=rows,
                        attn_mask=attn_mask.to(device), last_index=rows, is_decode=True)


def paged_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    cache: KVCache, ctx: PagedContext, scale: float) -> torch.Tensor:
    """q [N, H, D], k/v [N, Hkv, D] for the packed new tokens -> attention output [N, H, D].
    Writes the new K/V into the cache first, so a token attends to itself through the cache."""
    n, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    k_layer, v_layer = cache.k[layer], cache.v[layer]
    k_layer.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, k)
    v_layer.view(-1, num_kv_heads, head_dim).index_copy_(0, ctx.slot_mapping, v)
    num_seqs = ctx.block_tables.shape[0]
    blocks = ctx.block_tables.flatten()  # index_select copies whole blocks: ~5x faster than k_layer[tables]
    keys = k_layer.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    values = v_layer.index_select(0, blocks).view(num_seqs, -1, num_kv_heads, head_dim).transpose(1, 2)
    queries = q.unsqueeze(2) if ctx.is_decode else q[ctx.query_index].transpose(1, 2)  # [B, H, Tq, D]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=ctx.attn_mask, scale=scale,
                                         enable_gqa=num_heads != num_kv_heads)
    if ctx.is_decode:
        return out.reshape(num_seqs, num_heads, head_dim)
    out = out.transpose(1, 2).reshape(-1, num_heads, head_dim)          # [B*Tq, H, D]
    return out[ctx.output_index]
