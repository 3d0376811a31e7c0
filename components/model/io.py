"""Read and write HF-format model folders: config.json + *.safetensors (one file, or
shards listed in model.safetensors.index.json). Parameter names are HF Qwen2's, so a
folder written here loads in transformers and the other way round. No pickle."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import torch
from safetensors.torch import load_file, save_file

from dynarl.components.model.config import CONFIG_FILE, ModelConfig, read_config
from dynarl.components.model.lora import is_adapter
from dynarl.components.model.qwen2 import Qwen2ForCausalLM

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TIED_NAME = "lm_head.weight"


def read_state_dict(folder: str | Path) -> dict[str, torch.Tensor]:
    folder = Path(folder)
    if (folder / INDEX_FILE).is_file():
        weight_map = json.loads((folder / INDEX_FILE).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (folder / SINGLE_FILE).is_file():
        files = [SINGLE_FILE]
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {folder}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(folder / name))
    return state


def load_pretrained(folder: str | Path, dtype: torch.dtype | None = None,
                    device: str | torch.device = "cpu") -> Qwen2ForCausalLM:
    """Build the model from config.json and fill it from the safetensors files.
    Missing, unexpected or wrongly shaped tensors raise ValueError naming them."""
    config = read_config(folder)
    model = Qwen2ForCausalLM(config)
    load_weights(model, read_state_dict(folder).items(), strict=True)
    if dtype is not None:
        model.to(dtype)
    return model.to(device)


def load_weights(model: Qwen2ForCausalLM, named_tensors: Iterable[tuple[str, torch.Tensor]],
                 strict: bool = False) -> list[str]:
    """Copy tensors into the model's parameters by HF name (dtype cast to the parameter's).
    Everything is checked before anything is copied, so a bad name or shape leaves the
    model unchanged. strict: every parameter must be given (the tied lm_head may be left
    out). Returns the names loaded."""
    params = dict(model.named_parameters(remove_duplicate=False))
    # older HF checkpoints also store the derived rotary inv_freq buffer
    items = [(name, t) for name, t in named_tensors if not name.endswith("rotary_emb.inv_freq")]
    for name, tensor in items:
        if name not in params:
            raise ValueError(f"unexpected tensor {name!r}: not a parameter of this model")
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, "
                             f"the model expects {tuple(params[name].shape)}")
    if strict:
        missing = set(params) - {name for name, _ in items}
        if model.config.tie_word_embeddings:
            missing.discard(TIED_NAME)
        if missing:
            raise ValueError(f"missing tensors: {sorted(missing)}")
    with torch.no_grad():
        for name, tensor in items:
            params[name].copy_(tensor.to(device=params[name].device, dtype=params[name].dtype))
    return [name for name, _ in items]


def save_pretrained(model: Qwen2ForCausalLM, folder: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write config.json and the weights; above max_shard_bytes per file, shards
    model-0000i-of-0000n.safetensors plus the index, as HF does."""
    save_state(model.config, model.state_dict(), folder, max_shard_bytes)


def save_state(config: ModelConfig, state: Mapping[str, torch.Tensor], folder: str | Path,
               max_shard_bytes: int | None = None) -> None:
    """save_pretrained from a config and tensors by HF name (no model needed): e.g. the
    merged weights of a LoRA model (lora.py merge_lora). config.json's dtype is the
    first tensor's."""
    adapters = [name for name in state if is_adapter(name)]
    if adapters:
        raise ValueError(f"{adapters[0]} is a LoRA adapter, which an HF model folder has no place for: "
                         "save merge_lora's weights (lora_export.py writes both)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = config.to_hf_dict()
    first = next(iter(state.values()))
    hf["torch_dtype"] = hf["dtype"] = str(first.dtype).removeprefix("torch.")
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2))
    tensors = {name: t.detach().contiguous().cpu() for name, t in state.items()}
    if config.tie_word_embeddings:
        tensors.pop(TIED_NAME, None)  # safetensors refuses shared storage; HF leaves it out too
    shards = _split(tensors, max_shard_bytes)
    for stale in list(folder.glob("*.safetensors")) + [folder / INDEX_FILE]:
        stale.unlink(missing_ok=True)
    if len(shards) == 1:
        save_file(shards[0], folder / SINGLE_FILE, metadata={"format": "pt"})
        return
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))


def _split(state: dict[str, torch.Tensor], max_bytes: int | None) -> list[dict[str, torch.Tensor]]:
    if max_bytes is None:
        return [state]
    if max_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_bytes}")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards
