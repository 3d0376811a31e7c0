"""Packing a slice of a TrainBatch into padded tensors for one forward/backward.

Sequences are right-padded to the longest in the micro-batch. Logits at
position t predict token t + 1, so a response token at sequence position j is
scored at "target" position j - 1. `loss_mask` marks target positions in the
loss; per-token values (advantages, old/behaviour/ref log-probs, targets, a critic's
returns and old values) are stored only
for those positions, in row-major order, which is the order boolean indexing
`x[:, :-1][loss_mask]` produces.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from dynarl.components.trainer.base import TrainBatch


@dataclass(slots=True)
class MicroBatch:
    input_ids: torch.Tensor        # [B, T] long, right-padded with 0
    attention_mask: torch.Tensor   # [B, T] long, 1 on real tokens
    loss_mask: torch.Tensor        # [B, T-1] bool, target positions in the loss
    targets: torch.Tensor          # [n] long, the tokens those positions predict
    advantages: torch.Tensor       # [n] float32
    old_logprobs: torch.Tensor | None  # [n] float32
    behav_logprobs: torch.Tensor | None  # [n] float32
    ref_logprobs: torch.Tensor | None  # [n] float32
    num_tokens: int                # n
    returns: torch.Tensor | None = None  # [n] float32 (a critic's batch)
    old_values: torch.Tensor | None = None  # [n] float32


def build_micro_batch(batch: TrainBatch, advantages: Sequence, rows: Sequence[int],
                      device: torch.device) -> MicroBatch:
    """`advantages[i]` is a float (one per sample) or a list (one per response token)."""
    width = max(len(batch.input_ids[i]) for i in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), max(width - 1, 0), dtype=torch.bool)
    targets: list[int] = []
    adv: list[float] = []
    old: list[float] = []
    behav: list[float] = []
    ref: list[float] = []
    returns: list[float] = []
    old_values: list[float] = []
    for b, i in enumerate(rows):
        seq, plen = batch.input_ids[i], batch.prompt_lens[i]
        ids[b, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, :len(seq)] = 1
        per_token_adv = isinstance(advantages[i], (list, tuple))
        for k in range(len(seq) - plen):
            if batch.response_mask is not None and not batch.response_mask[i][k]:
                continue
            loss_mask[b, plen + k - 1] = True
            targets.append(seq[plen + k])
            adv.append(advantages[i][k] if per_token_adv else advantages[i])
            if batch.old_logprobs is not None:
                old.append(batch.old_logprobs[i][k])
            if batch.behav_logprobs is not None:
                behav.append(batch.behav_logprobs[i][k])
            if batch.ref_logprobs is not None:
                ref.append(batch.ref_logprobs[i][k])
            if batch.returns is not None:
                returns.append(batch.returns[i][k])
                old_values.append(batch.old_values[i][k])

    def floats(values: list[float]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    return MicroBatch(
        input_ids=ids.to(device), attention_mask=attn.to(device), loss_mask=loss_mask.to(device),
        targets=torch.tensor(targets, dtype=torch.long, device=device), advantages=floats(adv),
        old_logprobs=floats(old) if batch.old_logprobs is not None else None,
        behav_logprobs=floats(behav) if batch.behav_logprobs is not None else None,
        ref_logprobs=floats(ref) if batch.ref_logprobs is not None else None,
        num_tokens=len(targets),
        returns=floats(returns) if batch.returns is not None else None,
        old_values=floats(old_values) if batch.old_values is not None else None)
