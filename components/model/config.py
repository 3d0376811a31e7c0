"""Shape of a decoder of the Qwen2 / Qwen3 / Llama family, with the field names of
HF's config.json. The three differ in little: Qwen2 has q/k/v biases; Qwen3 has none
and RMS-normalises each head's q and k before RoPE (and may set head_dim apart from
hidden_size / heads); Llama has no bias, and Llama 3 scales RoPE's frequencies.

No I/O here: `io.py` reads and writes config.json and calls `from_hf_dict`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


SUPPORTED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
"""config.json model_type values the native model implements (Qwen2 and Qwen2.5 use qwen2)."""
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}


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
    model_type: str = "qwen2"
    attention_bias: bool = True
    """q/k/v projections with biases (Qwen2); Qwen3 and Llama have none."""
    qk_norm: bool = False
    """RMSNorm over each head's q and k before RoPE (Qwen3)."""
    explicit_head_dim: int | None = None
    """config.json's head_dim when it is not hidden_size // num_attention_heads (Qwen3)."""
    rope_llama3: tuple[float, float, float, int] | None = None
    """Llama 3's RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)."""
    head_dim: int = field(init=False)
    """explicit_head_dim, else hidden_size // num_attention_heads."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)}")
        if self.explicit_head_dim is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be divisible by "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        head_dim = self.explicit_head_dim or self.hidden_size // self.num_attention_heads
        object.__setattr__(self, "head_dim", head_dim)  # frozen
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")
        if self.rope_llama3 is not None:
            factor, low, high, original = self.rope_llama3
            if not (factor >= 1 and 0 < low < high and original >= 1):
                raise ValueError(f"rope_llama3 (factor, low_freq_factor, high_freq_factor, original_max_position_"
                                 f"embeddings) must have factor >= 1 and 0 < low < high, got {self.rope_llama3}")
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
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim
        attention = 2 * h * q + 2 * h * kv  # q, k, v, o
        attention += (q + 2 * kv) * self.attention_bias + 2 * self.head_dim * self.qk_norm
        layer = attention + 3 * h * self.intermediate_size + 2 * h
        head = 0 if self.tie_word_embeddings else self.vocab_size * h
        return self.vocab_size * h + self.num_hidden_layers * layer + h + head

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json content that transformers' config of the model_type (4.x and 5.x) reads."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_llama3 is not None:
            factor, low, high, original = self.rope_llama3
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": factor, "low_freq_factor": low,
                    "high_freq_factor": high, "original_max_position_embeddings": original}
        return {
            "architectures": [ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "head_dim": self.head_dim,
            "attention_bias": self.attention_bias,
            "mlp_bias": False,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope,
            **({"rope_scaling": rope} if self.rope_llama3 is not None else {}),
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
        """Reads an HF config.json dict (Qwen2, Qwen3, Llama); rejects the variants this model
        does not implement."""
        model_type = d.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_MODEL_TYPES)} (Qwen2/2.5, Qwen3, Llama 2/3)")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act must be 'silu', got {d['hidden_act']!r}")
        if d.get("use_sliding_window", False):
            raise ValueError("use_sliding_window=True is not supported")
        if d.get("mlp_bias", False):
            raise ValueError("mlp_bias=True is not supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_parameters.rope_type must be 'default' or 'llama3', got {rope_type!r}")
        rope_theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
        llama3 = None
        if rope_type == "llama3":
            llama3 = (float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                      int(rope["original_max_position_embeddings"]))
        eos = d.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        num_heads = d.get("num_attention_heads")
        head_dim = d.get("head_dim")
        derived = d["hidden_size"] // num_heads if isinstance(d.get("hidden_size"), int) and num_heads else None
        if model_type == "qwen2" and head_dim not in (None, derived):
            raise ValueError(f"head_dim must equal hidden_size / num_attention_heads = {derived}, got {head_dim}")
        config = cls(
            model_type=model_type,
            attention_bias=True if model_type == "qwen2" else bool(d.get("attention_bias", False)),
            qk_norm=model_type == "qwen3",
            explicit_head_dim=head_dim if head_dim not in (None, derived) else None,
            rope_llama3=llama3,
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


CONFIG_FILE = "config.json"


def read_config(folder: str | Path) -> ModelConfig:
    """A model folder's config.json (no torch: a reward worker or the controller checks a folder with it)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_FILE} in {folder}")
    return ModelConfig.from_hf_dict(json.loads(path.read_text()))
