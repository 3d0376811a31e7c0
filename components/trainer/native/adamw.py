"""AdamW on one flat fp32 shard of the parameter space.

Every operation is elementwise, so updating a shard gives bit-for-bit the same
values as updating the whole vector: ZeRO-1 sharding and resharding change who
computes an element, never its value. The code uses only plain mul/add/div/sqrt
(no `alpha=`, addcmul or lerp) because fused multiply-add paths can round
differently in the vectorised body and the scalar tail of a kernel, which would
make an element's result depend on where the shard boundary falls.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                 *, step: int, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 decay_segments: Sequence[tuple[int, int]]) -> None:
    """One AdamW step in place (Loshchilov & Hutter; torch.optim.AdamW's arithmetic):

        theta <- theta * (1 - lr * wd)             on decay_segments only
        m     <- b1 * m + (1 - b1) * g
        v     <- b2 * v + (1 - b2) * g^2
        theta <- theta - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    `step` is t, counted from 1. `decay_segments` are [lo, hi) slices of the shard
    that get weight decay.
    """
    beta1, beta2 = betas
    if weight_decay:
        keep = 1.0 - lr * weight_decay
        for lo, hi in decay_segments:
            param[lo:hi].mul_(keep)
    exp_avg.mul_(beta1).add_(grad * (1.0 - beta1))
    exp_avg_sq.mul_(beta2).add_(grad * grad * (1.0 - beta2))
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
    param.sub_(exp_avg / denom * (lr / bias_correction1))
