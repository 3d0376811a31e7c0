"""Megatron-core <-> HF weight conversion (Qwen2/2.5, Qwen3, Llama 2/3), and
tensor-parallel slicing rules.

Pure torch, no megatron import: these functions run anywhere, so the name maps and
the qkv / gate-up layouts are tested even where the megatron extra is absent.

Megatron names are those of GPTModel built from the *local* layer spec
(docs/BACKENDS.md B2), with the *global* layer index (a pipeline stage's local
index plus its layer offset). A "full" tensor is the unsharded one; a TP rank
holds a slice of it:

    fused qkv    [groups * (q_per_group + 2) * head_dim, hidden]
                 group g = its q heads, then its one k head, then its one v head;
                 groups are contiguous, so TP cuts whole groups along dim 0
    linear_fc1   [gate ; up] along dim 0; a TP rank holds [gate_r ; up_r]
    column-parallel (dim 0): qkv, fc1, word embeddings, output layer
    row-parallel (dim 1): linear_proj, linear_fc2; norms are replicated
                 (Qwen3's q/k norms too: they act on one head's dimension)

The architectures differ only in which tensors exist: qkv biases (Qwen2,
ModelConfig.attention_bias) and per-head q/k norms (Qwen3, ModelConfig.qk_norm).
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator, Mapping, Sequence

import torch

from dynarl.components.model.config import ModelConfig

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")

# megatron suffix -> HF suffix, for the one-to-one tensors of a layer
_LAYER_RENAMES = {
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
}
_TOP_RENAMES = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}


def tp_partition(name: str) -> tuple[int | None, bool]:
    """(partition dim or None if replicated, whether the dim holds [gate ; up])."""
    if name.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")):
        return 0, False
    if name.endswith("linear_fc1.weight"):
        return 0, True
    if name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1, False
    return None, False


def slice_for_tp(name: str, full: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This TP rank's part of a full Megatron tensor (a view where torch allows)."""
    dim, glu = tp_partition(name)
    if dim is None or tp_size == 1:
        return full
    if glu:
        gate, up = full.chunk(2, dim=dim)
        return torch.cat([gate.chunk(tp_size, dim=dim)[tp_rank], up.chunk(tp_size, dim=dim)[tp_rank]], dim=dim)
    return full.chunk(tp_size, dim=dim)[tp_rank]


def join_tp_shards(name: str, shards: Sequence[torch.Tensor]) -> torch.Tensor:
    """The full tensor from every TP rank's part, in TP rank order (inverse of slice_for_tp)."""
    dim, glu = tp_partition(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if glu:
        halves = [s.chunk(2, dim=dim) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=dim)
    return torch.cat(list(shards), dim=dim)


def _qkv_shape(config: ModelConfig) -> tuple[int, int, int]:
    groups = config.num_key_value_heads
    return groups, config.num_attention_heads // groups, config.head_dim


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """HF q/k/v (weights [out, hidden] or biases [out]) -> Megatron's grouped linear_qkv."""
    groups, q_per_group, head_dim = _qkv_shape(config)
    rest = q.shape[1:]
    parts = (q.reshape(groups, q_per_group * head_dim, *rest), k.reshape(groups, head_dim, *rest),
             v.reshape(groups, head_dim, *rest))
    return torch.cat(parts, dim=1).reshape(groups * (q_per_group + 2) * head_dim, *rest)


def split_qkv(qkv: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of fuse_qkv."""
    groups, q_per_group, head_dim = _qkv_shape(config)
    rest = qkv.shape[1:]
    grouped = qkv.reshape(groups, (q_per_group + 2) * head_dim, *rest)
    q, k, v = grouped.split([q_per_group * head_dim, head_dim, head_dim], dim=1)
    return (q.reshape(groups * q_per_group * head_dim, *rest), k.reshape(groups * head_dim, *rest),
            v.reshape(groups * head_dim, *rest))


def megatron_to_hf(name: str, full: torch.Tensor, config: ModelConfig) -> list[tuple[str, torch.Tensor]]:
    """One full Megatron tensor (global layer index) -> its HF tensors."""
    if name in _TOP_RENAMES:
        return [(_TOP_RENAMES[name], full)]
    match = _LAYER.match(name)
    if match is None:
        raise ValueError(f"no HF name for Megatron tensor {name!r}")
    prefix, suffix = f"model.layers.{match.group(1)}.", match.group(2)
    if suffix in _LAYER_RENAMES:
        return [(prefix + _LAYER_RENAMES[suffix], full)]
    if suffix in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = suffix.rsplit(".", 1)[1]
        q, k, v = split_qkv(full, config)
        return [(f"{prefix}self_attn.{p}_proj.{kind}", t) for p, t in zip("qkv", (q, k, v))]
    if suffix == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return [(prefix + "mlp.gate_proj.weight", gate), (prefix + "mlp.up_proj.weight", up)]
    raise ValueError(f"no HF name for Megatron tensor {name!r}")


def hf_to_megatron(hf: Mapping[str, torch.Tensor], config: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """A complete HF state dict -> full Megatron tensors (global layer index), in model
    order. A tied model's lm_head may be absent (Megatron shares the embedding)."""
    def get(key: str) -> torch.Tensor:
        if key not in hf:
            raise ValueError(f"HF state dict lacks {key!r}")
        return hf[key]

    yield "embedding.word_embeddings.weight", get("model.embed_tokens.weight")
    for i in range(config.num_hidden_layers):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        yield m + "input_layernorm.weight", get(p + "input_layernorm.weight")
        for kind in ("weight", "bias") if config.attention_bias else ("weight",):
            q, k, v = (get(f"{p}self_attn.{x}_proj.{kind}") for x in "qkv")
            yield f"{m}self_attention.linear_qkv.{kind}", fuse_qkv(q, k, v, config)
        if config.qk_norm:
            yield m + "self_attention.q_layernorm.weight", get(p + "self_attn.q_norm.weight")
            yield m + "self_attention.k_layernorm.weight", get(p + "self_attn.k_norm.weight")
        yield m + "self_attention.linear_proj.weight", get(p + "self_attn.o_proj.weight")
        yield m + "pre_mlp_layernorm.weight", get(p + "post_attention_layernorm.weight")
        yield m + "mlp.linear_fc1.weight", torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")])
        yield m + "mlp.linear_fc2.weight", get(p + "mlp.down_proj.weight")
    yield "decoder.final_layernorm.weight", get("model.norm.weight")
    if not config.tie_word_embeddings:
        yield "output_layer.weight", get("lm_head.weight")


def global_layer_name(local_name: str, layer_offset: int) -> str:
    """A pipeline stage's parameter name with its local layer index made global."""
    match = _LAYER.match(local_name)
    if match is None or layer_offset == 0:
        return local_name
    return f"decoder.layers.{int(match.group(1)) + layer_offset}.{match.group(2)}"



def hf_names(config: ModelConfig) -> list[str]:
    """Every HF tensor name in the order of the native model's named_parameters()
    (what weight_sync's receivers derive their bucket plan from), read off that model
    built on the meta device (no memory). A tied model has no lm_head entry."""
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM

    with torch.device("meta"):
        return [name for name, _ in Qwen2ForCausalLM(config).named_parameters()]


def in_order(named: Iterable[tuple[str, torch.Tensor]], order: Sequence[str]) -> Iterator[tuple[str, torch.Tensor]]:
    """Re-emit (name, tensor) pairs in `order`, holding back only those that arrive
    early (megatron and HF order a layer's tensors differently; layers come in the
    same order, so at most about one layer is held). Every name must come exactly once."""
    wanted = iter(order)
    want = next(wanted, None)
    held: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    for name, tensor in named:
        if name in seen:
            raise ValueError(f"{name} arrived twice")
        seen.add(name)
        held[name] = tensor
        while want is not None and want in held:
            yield want, held.pop(want)
            want = next(wanted, None)
    if held or want is not None:
        raise ValueError(f"tensors and order disagree: unexpected {sorted(held)[:4]}, missing {want!r}")
