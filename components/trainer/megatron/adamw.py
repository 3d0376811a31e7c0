"""dynarl's AdamW on a megatron model's local parameters, behind megatron's optimizer
interface (zero_grad, step -> (success, grad_norm, num_zeros), offload_to_cpu,
restore_from_cpu, param_groups).

Why it exists: megatron-core's own optimizers allocate on "cuda" in their
constructors (docs/BACKENDS.md B3), so a megatron trainer on a CPU needs another one.
This one applies AdamW elementwise (`adamw_update`, torch.optim.AdamW's arithmetic, decay on 2+-dim tensors only, clip by the global norm) to each rank's
TP slice, reading the gradient megatron's DDP reduced into `param.main_grad`. With
use_distributed_optimizer off, DDP all-reduces that gradient, so every DP replica
takes the same step and holds the same state. Its state is plain tensors keyed by
local parameter name: what export_state_shard and checkpoints save.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
import torch.distributed as dist

from dynarl.components.trainer.base import TrainerConfig

MOMENTS = ("exp_avg", "exp_avg_sq")


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


class LocalAdamW:
    def __init__(self, ddp_model: Any, config: TrainerConfig, megatron: Any = None) -> None:
        self.config = config
        self.named = list(ddp_model.module.named_parameters())
        self.param_groups = [{"lr": config.lr}]
        """megatron's optimizers expose param_groups; the trainer sets "lr" before a step
        (the warm start trains with its own learning rate)."""
        self.steps = 0
        self.state = {name: {m: torch.zeros_like(p, dtype=torch.float32) for m in MOMENTS}
                      for name, p in self.named}

    def zero_grad(self) -> None:
        pass  # DistributedDataParallel.zero_grad_buffer() zeroes main_grad

    @torch.no_grad()
    def step(self) -> tuple[bool, float, None]:
        cfg = self.config
        grads = {name: p.main_grad.float() for name, p in self.named}
        grad_norm = self._global_norm(grads)
        coef = cfg.grad_clip / (grad_norm + 1e-6) if cfg.grad_clip > 0 else 1.0
        self.steps += 1
        for name, p in self.named:
            grad = grads[name] * coef if coef < 1.0 else grads[name]
            state = self.state[name]
            flat = p.data.view(-1)
            adamw_update(flat, grad.reshape(-1), state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1),
                         step=self.steps, lr=self.param_groups[0]["lr"], betas=cfg.betas, eps=cfg.eps,
                         weight_decay=cfg.weight_decay, decay_segments=[(0, flat.numel())] if p.dim() >= 2 else [])
        return True, grad_norm, None

    def _global_norm(self, grads: Mapping[str, torch.Tensor]) -> float:
        """L2 norm of the whole model's gradient: TP-sharded slices are summed over the
        TP group, replicated tensors (norms) count once."""
        from megatron.core import parallel_state

        sharded = torch.zeros(1, dtype=torch.float64, device=self.named[0][1].device)
        replicated = torch.zeros_like(sharded)
        for name, p in self.named:
            sq = torch.sum(grads[name] * grads[name], dtype=torch.float64).reshape(1)
            if getattr(p, "tensor_model_parallel", False):
                sharded += sq
            else:
                replicated += sq
        if parallel_state.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(sharded, group=parallel_state.get_tensor_model_parallel_group())
        return math.sqrt(float((sharded + replicated).item()))

    # ---- state ------------------------------------------------------------------

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """"<moment>/<local parameter name>" -> tensor (live), and "step"."""
        out = {f"{m}/{name}": s[m] for name, s in self.state.items() for m in MOMENTS}
        out["step"] = torch.tensor([self.steps], dtype=torch.int64)
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        missing = [k for k in self.state_tensors() if k not in tensors]
        if missing:
            raise ValueError(f"optimizer state lacks {missing[:4]}")
        for name, s in self.state.items():
            for m in MOMENTS:
                src = tensors[f"{m}/{name}"]
                if tuple(src.shape) != tuple(s[m].shape):
                    raise ValueError(f"{m}/{name}: shape {tuple(src.shape)}, this rank holds {tuple(s[m].shape)}")
                s[m].copy_(src)
        self.steps = int(tensors["step"].reshape(-1)[0])

    def owned_ranges(self) -> None:
        """Every rank holds the whole state of its parameters (no flat ranges)."""
        return None

    def weights_loaded(self) -> None:
        """The weights are the parameters themselves: nothing to copy."""

    # ---- device residency ---------------------------------------------------------

    def offload_to_cpu(self) -> None:
        self._move("cpu")

    def restore_from_cpu(self) -> None:
        self._move(self.named[0][1].device)

    def _move(self, device: Any) -> None:
        for s in self.state.values():
            for m in MOMENTS:
                s[m] = s[m].to(device)
