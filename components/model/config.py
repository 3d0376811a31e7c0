"""Shape of a Qwen2 decoder, with the field names of HF's Qwen2 config.json.

No I/O here: `io.py` reads and writes config.json and calls `from_hf_dict`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


SUPPORTED_MODEL_TYPES = ("qwen2",)
"""config.json model_type values the native model implements (Qwen2 and Qwen2.5 use qwen2)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ModelConfig:
    """Frozen: a model built from it and the KV cache sized from it must agree for its lifetime."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    """Fewer than num_attention_heads means grouped-query attention (GQA)."""
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    """lm_head shares model.embed_tokens.weight."""
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    head_dim: int = field(init=False)
    """hidden_size // num_attention_heads, as HF Qwen2 derives it."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)  # frozen
        if self.head_dim % 2:
            raise ValueError(f"head_dim (hidden_size / num_attention_heads = {self.head_dim}) must be even for RoPE")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size}), got {value}")

    @property
    def num_parameters(self) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = h * h + 2 * h * kv + 2 * kv + h + h * h  # q (+bias), k, v (+bias), o
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content that transformers' Qwen2Config (4.x and 5.x) reads."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "use_sliding_window": False,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Reads an HF Qwen2 config.json dict; rejects the variants this model does not implement."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2 and Qwen2.5 checkpoints)")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
        if d.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"rope_parameters.rope_type must be 'default', got {rope_type!r}")
        rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        num_heads = d.get("num_attention_heads")
        config = cls(
            vocab_size=d.get("vocab_size"),
            hidden_size=d.get("hidden_size"),
            intermediate_size=d.get("intermediate_size"),
            num_hidden_layers=d.get("num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=d.get("num_key_value_heads") or num_heads,
            max_position_embeddings=d.get("max_position_embeddings", 2048),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=d.get("pad_token_id"),
        )
        if d.get("head_dim") not in (None, config.head_dim):
            raise ValueError(f"head_dim must equal hidden_size / num_attention_heads = {config.head_dim}, "
                             f"got {d['head_dim']}")
        return config


def _tiny(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int) -> ModelConfig:
    # vocab 128 covers the built-in CharTokenizer (3 specials + printable ASCII).
    return ModelConfig(vocab_size=128, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=0)


TINY_CONFIGS: dict[str, ModelConfig] = {
    "tiny-0.5m": _tiny(2, 128, 512, 4, 2),
    "tiny-1m": _tiny(4, 128, 512, 4, 2),
    "tiny-4m": _tiny(4, 256, 1024, 8, 2),
}
