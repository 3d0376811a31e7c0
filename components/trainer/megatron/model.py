"""A megatron-core GPTModel shaped like the native decoder (local layer spec).

The decoder in megatron terms: RMSNorm, SwiGLU (gated_linear_unit + silu),
grouped-query attention (num_query_groups, kv_channels = head_dim), no linear bias
but Qwen2's q/k/v bias (add_qkv_bias), Qwen3's per-head q/k RMSNorm before RoPE
(qk_layernorm), RoPE with the model's base and Llama 3's frequency scaling
(rope_scaling), no dropout. The local spec (not TransformerEngine) is used so the
same code builds on a CPU; its parameter names are what convert.py maps.

Requires megatron-core and an initialized `parallel_state` (initialize_model_parallel).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dynarl.components.model.config import ModelConfig
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.trainer.megatron.convert import tp_partition
from dynarl.components.trainer.megatron.model_checks import check_tp_divisible, rope_scaling_problem


def transformer_config(model: ModelConfig, cfg: MegatronConfig, activation_checkpointing: bool = False):
    """activation_checkpointing: megatron's full recompute of every layer (TrainerConfig's flag)."""
    from megatron.core.transformer import TransformerConfig

    check_tp_divisible(model, cfg.tensor_parallel_size)
    bf16 = cfg.dtype == "bfloat16"
    return TransformerConfig(
        num_layers=model.num_hidden_layers, hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads, num_query_groups=model.num_key_value_heads,
        kv_channels=model.head_dim, ffn_hidden_size=model.intermediate_size,
        normalization="RMSNorm", layernorm_epsilon=model.rms_norm_eps,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=model.attention_bias,
        qk_layernorm=model.qk_norm,
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=cfg.tensor_parallel_size,
        pipeline_model_parallel_size=cfg.pipeline_parallel_size,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=cfg.use_cpu_initialization,
        # the losses are token sums over the global batch (see trainer.py): DDP must sum
        # gradients over data parallel, not average them
        calculate_per_token_loss=True,
        # fused kernels need TransformerEngine/Apex; the local spec runs without them
        gradient_accumulation_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        **(dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
           if activation_checkpointing else {}))


def build_gpt_model(model: ModelConfig, cfg: MegatronConfig, activation_checkpointing: bool = False):
    """The GPTModel of this rank's pipeline stage and tensor-parallel slice (recomputing each
    layer in the backward with activation_checkpointing; parameter names are the same)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if not parallel_state.model_parallel_is_initialized():
        raise RuntimeError("call megatron.core.parallel_state.initialize_model_parallel() first")
    problem = rope_scaling_problem(model)
    if problem:
        raise ValueError(problem)
    gpt = GPTModel(
        config=transformer_config(model, cfg, activation_checkpointing),
        transformer_layer_spec=get_gpt_layer_local_spec(qk_layernorm=model.qk_norm, normalization="RMSNorm"),
        vocab_size=model.vocab_size, max_sequence_length=model.max_position_embeddings,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True, share_embeddings_and_output_weights=model.tie_word_embeddings,
        position_embedding_type="rope", rotary_base=model.rope_theta,
        rope_scaling=model.rope_llama3 is not None,
        rope_scaling_factor=model.rope_llama3[0] if model.rope_llama3 else 8.0)
    check_partition_rules(gpt)
    return gpt


def check_partition_rules(gpt: torch.nn.Module) -> None:
    """convert.tp_partition must agree with the TP attributes megatron sets on each
    parameter; a megatron version that changes them fails here, not in a wrong export."""
    for name, param in gpt.named_parameters():
        expected, _ = tp_partition(name)
        actual = param.partition_dim if getattr(param, "tensor_model_parallel", False) else None
        if expected != actual:
            raise RuntimeError(f"megatron shards {name} along {actual}, convert.py expects {expected}")


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """[1, 1, s, s] bool, True = masked out (megatron's convention). Explicit, because
    megatron's default mask is built on "cuda" (docs/BACKENDS.md B3). Right padding needs
    nothing more: a real token never attends to a later pad."""
    return torch.ones(length, length, dtype=torch.bool, device=device).triu(1)[None, None]
