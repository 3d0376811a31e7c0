"""Bytes one rank of an engine holds on its device: weights, gradients, optimizer
state, activations, KV cache. Pure arithmetic on a model's shape; the sources are
beside each formula and in docs/memory.md.

The parameter count is the model config's own (`ModelConfig.num_parameters`, the
count the native model and megatron build); the KV bytes per token are the cost
model's formula (components/costmodel.py `ModelShape.kv_bytes_per_token`) at the
engine's dtype.
"""
from __future__ import annotations

from dynarl.components.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAM_BYTES = 12
"""fp32 master weights + Adam's two moments, per parameter: the 12 of ZeRO's
"K = 12" in 2P + 2P + KP = 16P bytes for mixed-precision Adam (Rajbhandari et al.
2020, ZeRO, section 3.1)."""
NATIVE_STATE_BYTES = 16
"""The native trainer's ZeRO-1 shard per parameter: fp32 master, exp_avg,
exp_avg_sq and the reduced gradient (trainer/native/trainer.py, STATE_NAMES)."""


def weight_bytes(model: ModelConfig, dtype_bytes: int, tp: int = 1) -> int:
    """The weights of one tensor-parallel rank: P x dtype bytes / TP (embeddings and
    the output layer are split by TP in megatron and SGLang too)."""
    return model.num_parameters * dtype_bytes // tp


def kv_bytes_per_token(model: ModelConfig, dtype_bytes: int, tp: int = 1) -> int:
    """K and V of one token: 2 x layers x kv_heads x head_dim x dtype bytes, the KV
    heads split over TP (replicated when TP exceeds them, as SGLang and vLLM do)."""
    heads = max(1, model.num_key_value_heads // tp)
    return 2 * model.num_hidden_layers * heads * model.head_dim * dtype_bytes


def layer_activation_bytes(model: ModelConfig, tokens: int, dtype_bytes: int, tp: int = 1) -> int:
    """Activations one decoder layer keeps for its backward, for `tokens` = s x b.

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models", eq. 2) count s.b.h.(10 + 24/t + 5.a.s/(h.t)) bytes per GPT layer at 16
    bits. Written per tensor for a decoder with GQA and a gated MLP of width I (Qwen2,
    Llama), with flash attention (no s x s scores kept) and dropout 0 (no masks):

        kept whole (t does not split them): the two norms' inputs, the QKV and MLP
            inputs                                      4 x h
        split by t: q and k for QK^T, v, the attention output (the out-projection's
            input)                                      2 x q + 2 x kv
            the gated MLP: gate, up, silu(gate) and the down-projection's input   4 x I

    times dtype bytes. For GPT's proportions (q = kv = h) the attention and norm terms
    are the paper's s.b.h.(8 + 8/t); its MLP keeps two 4h-wide tensors (16/t), a gated
    MLP of width I four I-wide ones (8.I/(h.t)). `dynarl bench memory` checks the sum
    against the native trainer's measured peak on CPU (docs/benchmarks.md)."""
    h, i = model.hidden_size, model.intermediate_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_key_value_heads * model.head_dim
    whole = 4 * h
    split = 2 * q + 2 * kv + 4 * i
    return tokens * dtype_bytes * (whole * tp + split) // tp


def logits_bytes(model: ModelConfig, tokens: int, bytes_per_logit: int, tp: int = 1) -> int:
    """The output layer's logits and what the loss keeps of them: tokens x vocab x the
    bytes all those copies take per logit (Korthikanti et al. 2022 section 4.1 count
    the cross-entropy's fp32 logits, 4.s.b.v; megatron's vocab-parallel loss splits v
    by t)."""
    return tokens * model.vocab_size * bytes_per_logit // tp


def activation_bytes(model: ModelConfig, tokens: int, dtype_bytes: int, tp: int = 1,
                     bytes_per_logit: int = 8) -> int:
    """A micro-batch's forward-backward peak beyond the weights: every layer's kept
    activations plus the output layer's logits (default: fp32 logits and the loss's
    fp32 log-softmax, 2 x 4 bytes)."""
    return (model.num_hidden_layers * layer_activation_bytes(model, tokens, dtype_bytes, tp)
            + logits_bytes(model, tokens, bytes_per_logit, tp))
