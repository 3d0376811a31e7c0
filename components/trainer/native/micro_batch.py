"""Packing a slice of a TrainBatch into tensors for one forward/backward.

Two layouts (`micro_batches` picks by trainer.max_tokens_per_micro_batch; null: by
the step's lengths, packing.packing_budget):
- padded: `micro_batch_size` samples, one row each, right-padded to the longest;
- packed: the samples packing.plan_micro_batches groups, concatenated into ONE row
  [1, T] with no padding; `cu_seqlens` keeps attention within each sample and
  `position_ids` restart at 0 for each (Qwen2ForCausalLM.forward's packed input).

Logits at position t predict token t + 1, so a response token at sequence position j
is scored at "target" position j - 1. `loss_mask` marks target positions in the
loss; per-token values (advantages, old/behaviour/ref log-probs, targets, a critic's
returns and old values) are stored only for those positions, in row-major order,
which is the order boolean indexing `x[:, :-1][loss_mask]` produces. A sample's last
position is never a target (its next token is not in the sample), so in a packed row
no sample scores the next one's first token.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.packing import packing_budget, plan_micro_batches


@dataclass(slots=True)
class MicroBatch:
    input_ids: torch.Tensor        # [B, T] long, right-padded with 0 (packed: [1, T])
    attention_mask: torch.Tensor   # [B, T] long, 1 on real tokens (packed: all 1)
    loss_mask: torch.Tensor        # [B, T-1] bool, target positions in the loss
    targets: torch.Tensor          # [n] long, the tokens those positions predict
    advantages: torch.Tensor       # [n] float32
    old_logprobs: torch.Tensor | None  # [n] float32
    behav_logprobs: torch.Tensor | None  # [n] float32
    ref_logprobs: torch.Tensor | None  # [n] float32
    num_tokens: int                # n
    returns: torch.Tensor | None = None  # [n] float32 (a critic's batch)
    old_values: torch.Tensor | None = None  # [n] float32
    position_ids: torch.Tensor | None = None  # packed: [1, T] long, each sample from 0
    cu_seqlens: torch.Tensor | None = None  # packed: [N + 1] int32, sample boundaries in the row
    rows: tuple[int, ...] = field(default=())  # the batch's samples here, in row order
    sample_index: torch.Tensor | None = None  # [n] long, each token's sample: its place in `rows`

    def logits(self, model: nn.Module) -> torch.Tensor:
        """`model`'s output on this micro-batch, [B, T, V] (packed: [1, T, V]); the
        positions in the loss are `logits[:, :-1][self.loss_mask]` either way."""
        if self.cu_seqlens is None:
            return model(self.input_ids, attention_mask=self.attention_mask)
        return model(self.input_ids, position_ids=self.position_ids, cu_seqlens=self.cu_seqlens)


def micro_batches(batch: TrainBatch, advantages: Sequence, config: TrainerConfig,
                  device: torch.device) -> list[MicroBatch]:
    """The micro-batches a step's forward/backward runs on: padded ones of
    `config.micro_batch_size` samples in batch order, or packed ones of at most a
    budget of tokens (a longer sample alone): packing.packing_budget decides, from
    `config.max_tokens_per_micro_batch` (null: auto). Some may have no loss token (num_tokens 0)."""
    lengths = [len(ids) for ids in batch.input_ids]
    budget = packing_budget(lengths, config.micro_batch_size, config.max_tokens_per_micro_batch) if lengths else 0
    if budget == 0:
        size = config.micro_batch_size
        return [build_micro_batch(batch, advantages, range(start, min(start + size, len(batch))), device)
                for start in range(0, len(batch), size)]
    return [build_packed_micro_batch(batch, advantages, rows, device) for rows in plan_micro_batches(lengths, budget)]


class _PerToken:
    """The per-token values of a micro-batch's loss positions, sample after sample."""

    def __init__(self, batch: TrainBatch, advantages: Sequence) -> None:
        self.batch, self.advantages = batch, advantages
        self.targets: list[int] = []
        self.adv: list[float] = []
        self.old: list[float] = []
        self.behav: list[float] = []
        self.ref: list[float] = []
        self.returns: list[float] = []
        self.old_values: list[float] = []
        self.sample: list[int] = []
        self.samples_added = 0

    def add(self, i: int) -> list[int]:
        """Appends sample i's loss tokens; returns their target positions in the sample."""
        batch = self.batch
        seq, plen = batch.input_ids[i], batch.prompt_lens[i]
        per_token_adv = isinstance(self.advantages[i], (list, tuple))
        positions = []
        for k in range(len(seq) - plen):
            if batch.response_mask is not None and not batch.response_mask[i][k]:
                continue
            positions.append(plen + k - 1)
            self.sample.append(self.samples_added)
            self.targets.append(seq[plen + k])
            self.adv.append(self.advantages[i][k] if per_token_adv else self.advantages[i])
            if batch.old_logprobs is not None:
                self.old.append(batch.old_logprobs[i][k])
            if batch.behav_logprobs is not None:
                self.behav.append(batch.behav_logprobs[i][k])
            if batch.ref_logprobs is not None:
                self.ref.append(batch.ref_logprobs[i][k])
            if batch.returns is not None:
                assert batch.old_values is not None  # (TrainBatch checks they go together)
                self.returns.append(batch.returns[i][k])
                self.old_values.append(batch.old_values[i][k])
        self.samples_added += 1
        return positions

    def micro_batch(self, ids: torch.Tensor, attn: torch.Tensor, loss_mask: torch.Tensor, rows: Sequence[int],
                    device: torch.device, **packed: torch.Tensor) -> MicroBatch:
        batch = self.batch

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        return MicroBatch(
            input_ids=ids.to(device), attention_mask=attn.to(device), loss_mask=loss_mask.to(device),
            targets=torch.tensor(self.targets, dtype=torch.long, device=device), advantages=floats(self.adv),
            old_logprobs=floats(self.old) if batch.old_logprobs is not None else None,
            behav_logprobs=floats(self.behav) if batch.behav_logprobs is not None else None,
            ref_logprobs=floats(self.ref) if batch.ref_logprobs is not None else None,
            num_tokens=len(self.targets),
            returns=floats(self.returns) if batch.returns is not None else None,
            old_values=floats(self.old_values) if batch.old_values is not None else None,
            rows=tuple(rows), sample_index=torch.tensor(self.sample, dtype=torch.long, device=device),
            **{name: t.to(device) for name, t in packed.items()})


def build_micro_batch(batch: TrainBatch, advantages: Sequence, rows: Sequence[int],
                      device: torch.device) -> MicroBatch:
    """The padded micro-batch of samples `rows`. `advantages[i]` is a float (one per
    sample) or a list (one per response token)."""
    width = max(len(batch.input_ids[i]) for i in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), max(width - 1, 0), dtype=torch.bool)
    tokens = _PerToken(batch, advantages)
    for b, i in enumerate(rows):
        seq = batch.input_ids[i]
        ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, :len(seq)] = 1
        for t in tokens.add(i):
            loss_mask[b, t] = True
    return tokens.micro_batch(ids, attn, loss_mask, rows, device)


def build_packed_micro_batch(batch: TrainBatch, advantages: Sequence, rows: Sequence[int],
                             device: torch.device) -> MicroBatch:
    """The samples `rows` concatenated into one row [1, T], T = their summed length:
    `position_ids` restart at 0 for each sample and `cu_seqlens` marks where each starts
    (attention stays within a sample). Same per-token fields as `build_micro_batch`."""
    lengths = [len(batch.input_ids[i]) for i in rows]
    total = sum(lengths)
    ids = torch.tensor([t for i in rows for t in batch.input_ids[i]], dtype=torch.long).reshape(1, total)
    positions = torch.cat([torch.arange(n, dtype=torch.long) for n in lengths]).reshape(1, total)
    cu_seqlens = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    loss_mask = torch.zeros(1, max(total - 1, 0), dtype=torch.bool)
    tokens = _PerToken(batch, advantages)
    offset = 0
    for i, n in zip(rows, lengths):
        for t in tokens.add(i):
            loss_mask[0, offset + t] = True
        offset += n
    return tokens.micro_batch(ids, torch.ones(1, total, dtype=torch.long), loss_mask, rows, device,
                              position_ids=positions, cu_seqlens=cu_seqlens)
