"""The native critic: PPO's value model, trained as the native trainer trains the
policy (data parallel on FSDP2, AdamW; trainer.py), on a different head and loss.

The model is the policy's decoder with its LM head replaced by a scalar head
(`value_head`): position t's hidden state gives V_t, the value of the state in
which response token t + 1 is sampled; so a response token's value sits at the
position whose logits would score it, and the micro-batch's `loss_mask` picks
both. A step minimises PPO's clipped value loss (losses.value_loss) towards the
batch's `returns`, clipped around its `old_values`.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.native.losses import token_mean, value_loss
from dynarl.components.trainer.native.micro_batch import MicroBatch
from dynarl.components.trainer.native.trainer import NativeTrainer


def value_head(model: nn.Module) -> nn.Module:
    """`model` (a causal LM with an `lm_head`) as a value model: the LM head becomes a
    zero-initialised [hidden -> 1] linear layer (every value starts at 0, as the
    critic of a reward-agnostic start should), untied from the embeddings."""
    lm_head = model.lm_head
    if not isinstance(lm_head, nn.Linear):
        raise ValueError(f"the model's lm_head is a {type(lm_head).__name__}, not a linear layer")
    head = nn.Linear(lm_head.in_features, 1, bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
    model.lm_head = head
    return model


class NativeCritic(NativeTrainer):
    """One data-parallel rank of the critic. `train_step` (and streaming `accumulate`)
    take a batch with `returns` and `old_values`; `values` computes V per response token."""

    TERMS = ("loss", "value_clip_frac")
    """(TrainMetrics fields: the value loss and the fraction of values clipped)"""

    def __init__(self, model: nn.Module, config: TrainerConfig, process_group=None) -> None:
        if getattr(getattr(model, "lm_head", None), "out_features", None) != 1:
            raise ValueError("the critic's model needs a scalar head: build it with critic.value_head(model)")
        super().__init__(model, config, process_group)

    def _advantages(self, batch: TrainBatch, reduce=None) -> list:
        """Zeros: the value loss reads the batch's returns and old values instead."""
        if batch.returns is None:
            raise ValueError("a critic's batch needs returns and old_values")
        return [0.0] * len(batch)

    @staticmethod
    def _loss_tokens(batch: TrainBatch, i: int) -> int:
        if batch.response_mask is None:
            return len(batch.input_ids[i]) - batch.prompt_lens[i]
        return sum(1 for m in batch.response_mask[i] if m)

    def _forward_backward(self, mb: MicroBatch, num_tokens: int, num_samples: int = 1) -> torch.Tensor:
        assert mb.old_values is not None and mb.returns is not None  # (_advantages checked the batch)
        values = self._values(mb)
        loss = value_loss(values, mb.old_values, mb.returns, torch.ones_like(values),
                          self.config.value_clip, num_tokens)
        clipped = ((values - mb.old_values).abs() > self.config.value_clip).to(values.dtype).detach()
        loss.backward()
        return torch.stack([loss.detach().double(), token_mean(clipped, torch.ones_like(clipped), num_tokens).double()])

    def _values(self, mb: MicroBatch) -> torch.Tensor:
        return mb.logits(self.model)[:, :-1, 0][mb.loss_mask].float()

    @torch.no_grad()
    def values(self, batch: TrainBatch) -> list[list[float]]:
        """V per response token of every sample (0 where the response mask is 0).
        Collective (FSDP gathers the weights): every rank runs as many forwards."""
        if not self._onloaded:
            raise RuntimeError("critic is offloaded; call onload() before values()")
        self.model.eval()
        micro = self._micro_batches(batch, [0.0] * len(batch))
        passes = int(self._all_reduce(torch.tensor([len(micro)], device=self.device), dist.ReduceOp.MAX).item())
        per_sample: dict[int, list[float]] = {}
        for index in range(passes):
            if index >= len(micro) or not micro[index].num_tokens:
                self.model(torch.zeros(1, 1, dtype=torch.long, device=self.device))  # (its part of the gathers)
                continue
            flat, cursor = self._values(micro[index]).tolist(), 0
            for i in micro[index].rows:  # the samples in row-major order, as the loss mask picks them
                n = self._loss_tokens(batch, i)
                per_sample[i], cursor = flat[cursor:cursor + n], cursor + n
        out: list[list[float]] = []
        for i in range(len(batch)):
            mask = batch.response_mask[i] if batch.response_mask is not None else None
            taken = iter(per_sample.get(i, []))
            out.append([next(taken) if mask is None or mask[k] else 0.0
                        for k in range(len(batch.input_ids[i]) - batch.prompt_lens[i])])
        return out
