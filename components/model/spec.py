"""Which model a job runs: a built-in tiny config (random init) or an HF folder.

A spec is plain data (it travels to every worker in its init kwargs); each
worker builds its own model and tokenizer from it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dynarl.components.model.config import TINY_CONFIGS, ModelConfig
from dynarl.components.model.lora_config import LoraConfig
from dynarl.components.model.tokenizer import CharTokenizer, HFTokenizer, load_tokenizer
from dynarl.core.config_tree import wire_config


DTYPES = ("auto", "float32", "bfloat16")


@wire_config(20)
@dataclass(kw_only=True, slots=True)
class ModelSpec:
    name: str = "tiny-0.5m"
    """A built-in tiny config (tiny-0.5m, tiny-1m, tiny-4m; character tokenizer); ignored when path is set."""
    path: str | None = None
    """An HF-format folder (config.json, *.safetensors, tokenizer) to start from."""
    init_seed: int = 0
    """Seeds the random initialisation of a built-in config."""
    dtype: str = "auto"
    """The dtype of the rollout and inference engines' weights, and so of the weight sync:
    auto (bfloat16 on a GPU, float32 on a CPU), float32 or bfloat16. The native trainer
    keeps float32 weights and casts them for the sync."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters for the native trainer (rank 0: off, the whole model trains)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.path is None and self.name not in TINY_CONFIGS:
            raise ValueError(f"unknown model {self.name!r}; choose from {', '.join(map(repr, TINY_CONFIGS))} "
                             "or set model.path to an HF folder")
        if self.path is not None and not os.path.isfile(os.path.join(self.path, "config.json")):
            raise ValueError(f"model.path {self.path!r} has no config.json")
        if self.path is not None:
            self.config()  # an architecture the native model does not implement fails here, at load

    def engine_dtype(self, device_kind: str) -> Any:
        """The torch dtype of the engines' weights on a `device_kind` device (cuda, cpu, emulated)."""
        import torch
        name = self.dtype if self.dtype != "auto" else ("bfloat16" if device_kind == "cuda" else "float32")
        return getattr(torch, name)

    def config(self) -> ModelConfig:
        if self.path is None:
            return TINY_CONFIGS[self.name]
        from dynarl.components.model.config import read_config
        return read_config(self.path)


def build_model(spec: ModelSpec, device: Any = "cpu", dtype: Any = None) -> Any:
    """The model on `device` in `dtype` (default float32): seeded random weights (drawn
    on the CPU in float32, so every device and dtype starts from the same values), or
    the folder's weights."""
    import torch

    from dynarl.components.model.io import load_pretrained
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    dtype = dtype or torch.float32
    if spec.path is not None:
        return load_pretrained(spec.path, dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.init_seed)
        return Qwen2ForCausalLM(TINY_CONFIGS[spec.name]).to(device=device, dtype=dtype)


def build_policy_model(spec: ModelSpec, device: Any = "cpu") -> Any:
    """The native trainer's policy: build_model's float32 model, with LoRA adapters
    (components/model/lora.py; only they require grad) when spec.lora.rank > 0. The
    adapters' init is seeded by init_seed, so every rank starts from the same ones."""
    model = build_model(spec, device)
    if spec.lora.enabled:
        from dynarl.components.model.lora import apply_lora
        apply_lora(model, spec.lora, seed=spec.init_seed)
    return model


def meta_model(spec: ModelSpec, dtype: Any) -> Any:
    """The architecture on the meta device in `dtype`: names, shapes and dtype, no memory
    (what a weight sync plans its buckets from where no model is held)."""
    import torch

    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    with torch.device("meta"):
        return Qwen2ForCausalLM(spec.config()).to(dtype)


def build_tokenizer(spec: ModelSpec) -> CharTokenizer | HFTokenizer:
    return CharTokenizer() if spec.path is None else load_tokenizer(spec.path)


def safe_decode(tokenizer: CharTokenizer | HFTokenizer, ids: list[int]) -> str:
    """Text of generated ids without specials. Ids the model can emit but the
    tokenizer does not know (the model's vocabulary is padded) become U+FFFD, so
    such a response simply fails verification."""
    known = tokenizer.vocab_size
    if all(i < known for i in ids):
        return tokenizer.decode(ids)
    parts, run = [], []
    for i in ids:
        if i < known:
            run.append(i)
            continue
        parts.append(tokenizer.decode(run))
        parts.append("\ufffd")
        run = []
    parts.append(tokenizer.decode(run))
    return "".join(parts)


def prompt_check(tokenizer: CharTokenizer | HFTokenizer, max_prompt_tokens: int):
    """A dataset row check: the prompt must encode and fit. A text too long to fit however
    it tokenizes is refused by its length, before encoding (whose ids take many times
    the text's memory)."""
    max_chars = max_prompt_tokens * tokenizer.max_chars_per_token

    def check(text: str) -> str | None:
        if len(text) > max_chars:
            return (f"prompt has {len(text)} characters, more than the {max_prompt_tokens} tokens allowed "
                    f"can hold (at most {tokenizer.max_chars_per_token} characters a token)")
        try:
            n = len(tokenizer.encode(text, add_bos=True))
        except ValueError as exc:
            return str(exc)
        if n > max_prompt_tokens:
            return f"prompt has {n} tokens, more than the {max_prompt_tokens} allowed"
        return None
    return check
