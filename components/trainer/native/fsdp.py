"""How the native trainer shards a model with torch FSDP2 (fully_shard per decoder
layer, then the root), and a parameter's full or local tensor (DTensor or plain)."""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor


def shard(model: torch.nn.Module, mesh: DeviceMesh, dtype: torch.dtype, offload: bool) -> torch.nn.Module:
    """`fully_shard` each decoder layer, then the root (embeddings, final norm, head).
    Gradients are reduced as sums (the loss is already a global token-mean), by SUM
    collectives (gloo has no pre-multiplied sum)."""
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32) if dtype != torch.float32 \
        else MixedPrecisionPolicy()
    layers = getattr(getattr(model, "model", None), "layers", [])
    where = CPUOffloadPolicy() if offload else OffloadPolicy()
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy, offload_policy=where)
    fully_shard(model, mesh=mesh, mp_policy=policy, offload_policy=where)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return model


def full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t
