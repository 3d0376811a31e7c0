"""Runs the model on a scheduler batch: owns the KV cache tensors and builds the
block tables / slot mappings the paged forward reads."""
from __future__ import annotations

import torch

from dynarl.components.model.paged_attention import KVCache, PagedContext, build_decode_context
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.native.scheduler import Batch


class ModelRunner:
    def __init__(self, model: Qwen2ForCausalLM, num_blocks: int, block_size: int):
        self.model = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.cache: KVCache | None = None
        self.zeroed = self.wanted = 0
        """Blocks [0, zeroed) of the cache are zeroed; [0, wanted) must be before use
        (the block manager hands blocks out lowest first: `ensure_zeroed`)."""
        self.allocate()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def allocate(self) -> None:
        if self.cache is None:
            c = self.model.config
            dtype = next(self.model.parameters()).dtype
            self.cache = KVCache.allocate(c.num_hidden_layers, self.num_blocks, self.block_size,
                                          c.num_key_value_heads, c.head_dim, dtype, self.device, zeroed=False)
            self.zeroed = 0
            self.ensure_zeroed(self.wanted)

    def ensure_zeroed(self, num_blocks: int) -> None:
        """Blocks below `num_blocks` hold finite values before anything reads or fills
        them (called as the block manager first hands them out; again after a release).
        A run touches only the KV memory of its peak use, not the whole cache: on a CPU
        the pages of untouched blocks are never mapped, and no onload zeroes the lot."""
        self.wanted = max(self.wanted, num_blocks)
        if self.cache is not None and self.wanted > self.zeroed:
            self.cache.k[:, self.zeroed:self.wanted].zero_()
            self.cache.v[:, self.zeroed:self.wanted].zero_()
            self.zeroed = self.wanted

    def release(self) -> None:
        device = self.device
        self.cache, self.zeroed = None, 0  # the last reference: the tensors' memory goes back
        if device.type == "cuda":
            torch.cuda.empty_cache()  # from torch's caching allocator to the device

    def run(self, batch: Batch) -> torch.Tensor:
        """Logits [B, V] of the next token of every sequence in the batch."""
        assert self.cache is not None, "run() after release() without allocate()"
        seqs = batch.seqs
        context_lens, tables = [s.num_tokens for s in seqs], [s.block_table for s in seqs]
        if batch.is_prefill:
            new = [s.num_tokens - s.num_computed_tokens for s in seqs]
            ids = [t for s in seqs for t in s.token_ids[s.num_computed_tokens:]]
            ctx = PagedContext.build(new, context_lens, tables, self.block_size, self.device)
        else:
            ids = [s.token_ids[-1] for s in seqs]
            ctx = build_decode_context(context_lens, tables, self.block_size, self.device)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            return self.model.forward_paged(input_ids, self.cache, ctx)
