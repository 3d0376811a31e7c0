"""LoRA on the native model: a linear layer with a low-rank adapter, the swap that puts
it in place, and the merge back into plain weights.

The layer keeps the base `weight` and `bias` under their HF names and adds `lora_A`
[rank, in] and `lora_B` [out, rank] beside them (`...q_proj.lora_A`), so weight sync,
checkpoints and resharding that key on HF names see the base names unchanged, and
FSDP2 shards the adapters on dim 0 like every other parameter. (peft's
get_peft_model would rename the base to `...q_proj.base_layer.weight`.) The adapters
take the base weight's dtype and device: one dtype per model, as FSDP2 wants; the
native trainer's model is float32.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from dynarl.components.model.lora_config import LINEAR_NAMES, LoraConfig

ADAPTER_SUFFIXES = (".lora_A", ".lora_B")


def is_adapter(name: str) -> bool:
    """Whether a parameter name is an adapter's (`X.lora_A`, `X.lora_B`)."""
    return name.endswith(ADAPTER_SUFFIXES)


class LoraLinear(nn.Linear):
    """`base(x) + scaling * dropout(x) @ A^T @ B^T`: nn.Linear (same weight and bias
    parameters, not copies) plus a trainable low-rank update. B starts at zero, so the
    layer starts equal to the base."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight only to drop it
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_parameter("weight", base.weight)
        self.register_parameter("bias", base.bias)
        self.rank, self.scaling = rank, alpha / rank
        like = base.weight
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, dtype=like.dtype, device=like.device))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, dtype=like.dtype, device=like.device))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.reset_lora_parameters(generator)

    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        """peft's default init: A kaiming-uniform (as nn.Linear's weight), B zero. Drawn
        on the CPU in float32, so every device and dtype starts from the same values."""
        a = torch.empty(self.lora_A.shape, dtype=torch.float32)
        nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
        with torch.no_grad():
            self.lora_A.copy_(a)
            self.lora_B.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B)
        return F.linear(x, self.weight, self.bias) + self.scaling * update

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rank={self.rank}, scaling={self.scaling:g}"


def apply_lora(model: nn.Module, config: LoraConfig, seed: int = 0) -> nn.Module:
    """Swap every nn.Linear whose last name is in config.target_modules for a LoraLinear
    (in place, keeping its weights), freeze every other parameter (requires_grad False)
    and return the model. The adapters' initial values depend only on `seed` and the
    module order, so every rank builds the same ones. ValueError: rank 0, a target
    that matches no linear layer, a tied weight as target, or a model already adapted."""
    if not config.enabled:
        raise ValueError("apply_lora needs lora.rank >= 1 (0 means off)")
    modules = dict(model.named_modules())
    if any(isinstance(m, LoraLinear) for m in modules.values()):
        raise ValueError("the model already has LoRA layers")
    targets = [name for name, m in modules.items()
               if isinstance(m, nn.Linear) and name.rpartition(".")[2] in config.target_modules]
    found = {name.rpartition(".")[2] for name in targets}
    missing = [t for t in config.target_modules if t not in found]
    if missing:
        linear = sorted({n.rpartition(".")[2] for n, m in modules.items() if isinstance(m, nn.Linear)})
        raise ValueError(f"target_modules {missing} match no linear layer of the model; it has {linear}")
    shared = _shared_weights(model)
    if config.target_modules == LINEAR_NAMES:  # the default: a tied head stays out (its weight is the embeddings')
        targets = [name for name in targets if id(modules[name].weight) not in shared]
    for name in targets:
        if id(modules[name].weight) in shared:
            raise ValueError(f"target_modules: {name}.weight is tied to another parameter (tie_word_embeddings); "
                             "a merged adapter would untie it: leave it out")
    generator = torch.Generator().manual_seed(seed)
    for name in targets:
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, LoraLinear(modules[name], config.rank, config.alpha, config.dropout, generator))
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))
    return model


def _shared_weights(model: nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = seen.get(id(p), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def merge_lora(named: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """Full (gathered) tensors by name -> the plain model's: each `X.weight` with an
    `X.lora_A`/`X.lora_B` pair becomes W + scaling * B @ A (computed in float32, cast
    back to W's dtype), the adapter tensors are dropped, every other tensor passes
    through as is, in the input's order. This is what the rollout engines and
    save_pretrained take. ValueError names an adapter without its pair or weight."""
    prefixes = {name[:-len(".lora_A")] for name in named if name.endswith(".lora_A")}
    prefixes |= {name[:-len(".lora_B")] for name in named if name.endswith(".lora_B")}
    for prefix in sorted(prefixes):
        for part in ("lora_A", "lora_B", "weight"):
            if f"{prefix}.{part}" not in named:
                raise ValueError(f"{prefix} has adapter tensors but no {prefix}.{part}")
    out: dict[str, torch.Tensor] = {}
    for name, tensor in named.items():
        if is_adapter(name):
            continue
        prefix = name[:-len(".weight")] if name.endswith(".weight") else None
        if prefix in prefixes:
            a, b = named[f"{prefix}.lora_A"], named[f"{prefix}.lora_B"]
            merged = torch.addmm(tensor.detach().float(), b.detach().float(), a.detach().float(), alpha=scaling)
            out[name] = merged.to(tensor.dtype)
        else:
            out[name] = tensor
    return out
