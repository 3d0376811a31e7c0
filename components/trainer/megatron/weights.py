"""HF-named weights out of a tensor-parallel megatron model (for the rollout
engines, in buckets) and into it (from an HF checkpoint).

Export, per parameter in model order: all-gather the TP slices (every TP rank of
the stage takes part and receives the full tensor), join them (convert.join_tp_shards
re-chunks [gate_r ; up_r]), convert to HF names (qkv split, gate/up split). Each
pipeline stage exports its own layers with global indices; the rollout side
accepts any subset of the parameters, so a stage's TP-rank-0 can push its buckets.
"""
from __future__ import annotations

from typing import Iterator, Mapping

import torch
import torch.distributed as dist

from dynarl.components.model.config import ModelConfig
from dynarl.components.trainer.base import bucket_by_bytes
from dynarl.components.trainer.megatron.convert import (global_layer_name, hf_names, hf_to_megatron, in_order,
                                                        join_tp_shards, megatron_to_hf, slice_for_tp, tp_partition)


def _tp():
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_group(), parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_world_size())


def layer_offset(model: torch.nn.Module) -> int:
    """Global index of this pipeline stage's first transformer layer."""
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    return get_transformer_layer_offset(model.config)


def full_tensors(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Collective over the TP group. (global megatron name, full tensor), model order."""
    group, _, tp_size = _tp()
    offset = layer_offset(model)
    for name, param in model.named_parameters():
        local = param.detach()
        if tp_size > 1 and tp_partition(name)[0] is not None:
            parts = [torch.empty_like(local) for _ in range(tp_size)]
            dist.all_gather(parts, local.contiguous(), group=group)
            local = join_tp_shards(name, parts)
        yield global_layer_name(name, offset), local


def hf_buckets(model: torch.nn.Module, config: ModelConfig, bucket_bytes: int, dtype: torch.dtype | None = None
               ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Collective over the TP group. This stage's weights with HF names, in buckets of
    at most bucket_bytes (a tensor larger than that gets a bucket of its own). A stage
    holding the whole model emits them in the native model's parameter order, so the
    buckets are those weight_sync's receivers plan from their own native model."""
    from megatron.core import parallel_state

    converted = ((hf_name, (tensor if dtype is None else tensor.to(dtype)).contiguous())
                 for name, full in full_tensors(model)
                 for hf_name, tensor in megatron_to_hf(name, full, config))
    if parallel_state.get_pipeline_model_parallel_world_size() == 1:
        converted = in_order(converted, hf_names(config))
    yield from bucket_by_bytes(converted, bucket_bytes)


def load_hf_weights(model: torch.nn.Module, hf: Mapping[str, torch.Tensor], config: ModelConfig) -> None:
    """Fill this rank's slices from a complete HF state dict. Every parameter of the
    stage must be set; shapes are checked before anything is copied."""
    _, tp_rank, tp_size = _tp()
    offset = layer_offset(model)
    params = {global_layer_name(n, offset): p for n, p in model.named_parameters()}
    pending = []
    for name, full in hf_to_megatron(hf, config):
        param = params.get(name)
        if param is None:
            continue  # another pipeline stage's layer
        local = slice_for_tp(name, full, tp_rank, tp_size)
        if tuple(local.shape) != tuple(param.shape):
            raise ValueError(f"{name}: HF gives {tuple(local.shape)} for this rank, the model has {tuple(param.shape)}")
        pending.append((param, local))
    if len(pending) != len(params):
        missing = sorted(set(params) - {n for n, _ in hf_to_megatron(hf, config)})
        raise ValueError(f"HF state dict sets {len(pending)} of {len(params)} parameters; missing {missing[:4]}")
    with torch.no_grad():
        for param, local in pending:
            param.copy_(local.to(dtype=param.dtype, device=param.device))
