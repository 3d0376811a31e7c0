"""The emulated trainer's StateLayout: Qwen2's parameters by name and shape, no tensors.

Names, shapes and order are those of `named_parameters()` of the native model
(components/model/qwen2.py, HF naming), so a reshard plan or a weight-sync
bucket list made from an emulated trainer reads like one from a real trainer.
"""
from __future__ import annotations

import functools

from dynarl.components.costmodel import ModelShape
from dynarl.components.trainer.base import STATE_NAMES, ParamSpec, StateLayout, shard_ranges


def qwen2_param_shapes(model: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    h, kv = model.hidden_size, model.num_kv_heads * model.head_dim
    q = model.num_attention_heads * model.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (model.vocab_size, h))]
    for i in range(model.num_layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.q_proj.bias", (q,)),
            (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, q)),
            (p + "mlp.gate_proj.weight", (model.intermediate_size, h)),
            (p + "mlp.up_proj.weight", (model.intermediate_size, h)),
            (p + "mlp.down_proj.weight", (h, model.intermediate_size)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    shapes.append(("model.norm.weight", (h,)))
    if not model.tie_word_embeddings:  # a tied lm_head is the embedding, listed once
        shapes.append(("lm_head.weight", (model.vocab_size, h)))
    return shapes


@functools.lru_cache(maxsize=64)
def build_layout(model: ModelShape, world_size: int, dtype: str = "bfloat16") -> StateLayout:
    """One layout per (model, world size, dtype), shared by every caller: do not mutate
    it. Every rank of an N-rank group asks for it, and building one checks all N shard
    ranges, so uncached a group cost O(N^2): 4 x 4096 x 4096 range checks for a
    4096-device simulation's colocated trainer."""
    specs, total = _param_specs(model, dtype)
    ranges = _shard_ranges(total, world_size)
    return StateLayout(params=specs, total_numel=total, world_size=world_size,
                       shards={state: ranges for state in STATE_NAMES})


@functools.lru_cache(maxsize=16)
def _param_specs(model: ModelShape, dtype: str) -> tuple[tuple[ParamSpec, ...], int]:
    specs, offset = [], 0
    for name, shape in qwen2_param_shapes(model):
        spec = ParamSpec(name, shape, dtype, offset)
        specs.append(spec)
        offset += spec.numel
    return tuple(specs), offset


@functools.lru_cache(maxsize=64)
def _shard_ranges(total: int, world_size: int) -> tuple[tuple[int, int], ...]:
    return tuple(shard_ranges(total, world_size))


def synced_weight_bytes(model: ModelShape) -> int:
    """The bytes of one full weight sync: every parameter of the architecture in
    bfloat16, as the emulated trainer holds and sends them (its layout's count, not
    the model card's rounded one)."""
    return build_layout(model, 1).total_numel * 2
