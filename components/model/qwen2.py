"""Qwen2 decoder-only transformer with HF's parameter names (GQA, RoPE, RMSNorm, SwiGLU),
and its relatives by config (config.py): Qwen3 (no q/k/v bias, q/k RMSNorm per head)
and Llama (no bias, Llama 3's RoPE scaling). Same names, so one class loads all three.

Two ways to run it:
- `forward(input_ids, attention_mask)`: the whole sequence at once (training, log-probs);
  or, with `cu_seqlens`, several samples packed into one row, each attending to itself
  only (packed_attention.py; the trainer's packed micro-batches).
- `forward_paged(input_ids, cache, ctx)`: only the new tokens of each sequence, reading
  and writing a block KV cache (the rollout engine's prefill and batched decode).
Both share every layer; they differ only in how attention finds its keys.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from dynarl.components.model.config import ModelConfig
from dynarl.components.model.packed_attention import Window, packed_attention, packed_positions, uses_varlen, windows
from dynarl.components.model.paged_attention import KVCache, PagedContext, paged_attention

# attend(layer_index, q [..., H, D], k [..., Hkv, D], v [..., Hkv, D]) -> [..., H, D]
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one fused op: decode is op-bound
        # lower precision: normalise in fp32 and scale after casting back, as HF does
        return self.weight * F.rms_norm(x.float(), self.weight.shape, None, self.eps).to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                 llama3: tuple[float, float, float, int] | None = None):
    """cos/sin of shape [*positions.shape, 1, head_dim] (the 1 broadcasts over heads);
    computed in fp32 from the positions each call (cheap) so no buffer can be silently
    down-cast by `model.to(bfloat16)`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if llama3 is not None:
        inv_freq = llama3_frequencies(inv_freq, *llama3)
    freqs = positions[..., None].float() * inv_freq.to(positions.device)
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(-2)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def llama3_frequencies(inv_freq: torch.Tensor, factor: float, low_freq_factor: float, high_freq_factor: float,
                       original_context: int) -> torch.Tensor:
    """Llama 3's RoPE scaling (as transformers' `_compute_llama3_parameters`): wavelengths
    longer than original_context / low_freq_factor are slowed by `factor`, shorter than
    original_context / high_freq_factor kept, and the band between interpolated."""
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > original_context / low_freq_factor, inv_freq / factor, inv_freq)
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original_context / high_freq_factor) & (wavelen <= original_context / low_freq_factor)
    return torch.where(medium, smoothed, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, D] rotated by HF's rotate_half convention."""
    half = x.shape[-1] // 2
    return torch.addcmul(x * cos, torch.cat((-x[..., half:], x[..., :half]), dim=-1), sin)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(h, config.num_attention_heads * config.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, kv, bias=bias)
        self.v_proj = nn.Linear(h, kv, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, h, bias=False)
        if config.qk_norm:  # Qwen3: over each head's dimension, before RoPE
            self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.qk_norm = config.qk_norm

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # one rotation for q and k together: half the small ops, which dominate decode time
        qk = apply_rope(torch.cat((q, k), dim=-2), cos, sin)
        q, k = qk[..., :self.num_heads, :], qk[..., self.num_heads:, :]
        out = attend(self.layer_index, q, k, v)
        return self.o_proj(out.reshape(*lead, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.self_attn = Attention(config, layer_index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gradient_checkpointing = False
        """Activation checkpointing (set_activation_checkpointing): in training with grad on, each
        layer keeps only its input and recomputes the rest in the backward. A plain attribute, so
        parameter names (weight sync, reshard layouts, checkpoints) stay HF's."""

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attend: Attend, config: ModelConfig):
        x = self.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, config.head_dim, config.rope_theta, x.dtype, config.rope_llama3)
        # (never in the rollout's paged forward: it runs without grad, and its attend writes the KV cache)
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for layer in self.layers:
            if recompute:
                x = checkpoint(layer, x, cos, sin, attend, use_reentrant=False)
            else:
                x = layer(x, cos, sin, attend)
        return self.norm(x)


def set_activation_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Turn activation checkpointing on or off in every Qwen2Model inside `model` (a
    causal LM, a critic's value head on a decoder); TrainerConfig.activation_checkpointing."""
    decoders = [m for m in model.modules() if isinstance(m, Qwen2Model)]
    if enabled and not decoders:
        raise ValueError(f"activation checkpointing: {type(model).__name__} holds no Qwen2Model decoder")
    for decoder in decoders:
        decoder.gradient_checkpointing = enabled


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, init_std: float = 0.02):
        super().__init__()
        self.config = config
        self.model = Qwen2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.reset_parameters(init_std)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def reset_parameters(self, std: float = 0.02) -> None:
        """HF's initialisation: normal(0, std) matrices, zero biases, unit norms."""
        with torch.no_grad():
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    module.weight.normal_(0.0, std)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
                elif isinstance(module, RMSNorm):
                    module.weight.fill_(1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cu_seqlens: torch.Tensor | None = None
                ) -> torch.Tensor:
        """input_ids [B, T] -> logits [B, T, V]. attention_mask [B, T] (1 = token, 0 = pad)
        works with left or right padding; positions then count real tokens only. Logits at
        pad positions are meaningless.

        Packed samples: input_ids [1, T] holding N samples back to back, cu_seqlens [N + 1]
        their boundaries (0, len_0, len_0 + len_1, ..., T; packed_attention.py). Each
        sample attends only to itself and its positions restart at 0 (position_ids, if
        given, win); no attention_mask."""
        if cu_seqlens is not None:
            return self._forward_packed(input_ids, cu_seqlens, position_ids)
        batch, length = input_ids.shape
        device = input_ids.device
        if attention_mask is None:
            mask = None
            positions = torch.arange(length, device=device).expand(batch, length)
        else:
            keep = attention_mask.bool()
            causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
            # a pad query still attends to itself, so no softmax row is empty (no NaN)
            mask = (causal & keep[:, None, :]) | torch.eye(length, dtype=torch.bool, device=device)
            mask = mask[:, None]
            positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        if position_ids is not None:
            positions = position_ids.expand(batch, length)

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                is_causal=mask is None, enable_gqa=q.shape[2] != k.shape[2])
            return out.transpose(1, 2)

        return self.lm_head(self.model(input_ids, positions, attend, self.config))

    def _forward_packed(self, input_ids: torch.Tensor, cu_seqlens: torch.Tensor,
                        position_ids: torch.Tensor | None) -> torch.Tensor:
        batch, length = input_ids.shape
        bounds = cu_seqlens.tolist()
        if batch != 1 or bounds[0] != 0 or bounds[-1] != length:
            raise ValueError(f"packed input needs input_ids [1, T] and cu_seqlens from 0 to T; got "
                             f"input_ids {list(input_ids.shape)}, cu_seqlens from {bounds[0]} to {bounds[-1]}")
        max_seqlen = max(b - a for a, b in zip(bounds, bounds[1:]))
        positions = packed_positions(cu_seqlens, length) if position_ids is None else position_ids.reshape(-1)
        spans: list[list[Window]] = []  # the CPU path's windows, made once for all layers if needed

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if not spans and not uses_varlen(q):
                spans.append(windows(bounds, q.device))
            return packed_attention(q, k, v, cu_seqlens, max_seqlen, spans[0] if spans else None)

        return self.lm_head(self.model(input_ids, positions.expand(1, length), attend, self.config))

    def forward_paged(self, input_ids: torch.Tensor, cache: KVCache, ctx: PagedContext) -> torch.Tensor:
        """input_ids [N] packed new tokens -> logits [B, V] at each sequence's last new token."""
        scale = self.config.head_dim ** -0.5

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return paged_attention(layer, q, k, v, cache, ctx, scale)

        hidden = self.model(input_ids, ctx.positions, attend, self.config)
        return self.lm_head(hidden if ctx.is_decode else hidden[ctx.last_index])
