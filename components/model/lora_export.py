"""A LoRA model's tensors -> files: the merged HF folder (loads in transformers alone)
and, in its `adapter/` subfolder, the adapter in PEFT's format (adapter_config.json +
adapter_model.safetensors: loads with `peft.PeftModel.from_pretrained(base, folder)`).

Works on plain tensors by name (the native model's: base weights under HF names,
adapters as `X.lora_A` / `X.lora_B`), so whatever reads a checkpoint can feed it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

import torch
from safetensors.torch import save_file

from dynarl.components.model.config import ModelConfig
from dynarl.components.model.io import save_state
from dynarl.components.model.lora import is_adapter, merge_lora
from dynarl.components.model.lora_config import LoraConfig

ADAPTER_DIR = "adapter"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
"""What peft puts before a module's path in a saved adapter's tensor names."""


def adapter_state(named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors under PEFT's names: `X.lora_A` ->
    `base_model.model.X.lora_A.weight` (likewise B); every other tensor is left out."""
    return {f"{PEFT_PREFIX}{name}.weight": t.detach().contiguous().cpu()
            for name, t in named.items() if is_adapter(name)}


def adapter_config(config: LoraConfig, base_model_path: str | None) -> dict:
    """PEFT's adapter_config.json for `config` (fields peft does not get from us take
    its defaults when it loads the file)."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model_path,
            "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
            "target_modules": sorted(config.target_modules), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "init_lora_weights": True, "inference_mode": True,
            "modules_to_save": None, "layers_to_transform": None, "rank_pattern": {}, "alpha_pattern": {}}


def save_adapter(folder: str | Path, named: Mapping[str, torch.Tensor], config: LoraConfig,
                 base_model_path: str | None) -> list[str]:
    """Write the adapter of `named` in PEFT's format into `folder`; returns the files."""
    state = adapter_state(named)
    if not state:
        raise ValueError("no adapter tensors (X.lora_A, X.lora_B) to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ADAPTER_CONFIG_FILE).write_text(json.dumps(adapter_config(config, base_model_path), indent=2))
    save_file(state, folder / ADAPTER_WEIGHTS_FILE, metadata={"format": "pt"})
    return [ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE]


def write_lora_export(named: Mapping[str, torch.Tensor], model_config: ModelConfig, lora: LoraConfig,
                      out_dir: str | Path, base_model_path: str | None) -> list[str]:
    """The merged model (config.json, model.safetensors) in `out_dir` and the adapter in
    `out_dir/adapter/`; returns the files written, relative to out_dir."""
    save_state(model_config, merge_lora(named, lora.scaling), out_dir)
    adapter = save_adapter(Path(out_dir) / ADAPTER_DIR, named, lora, base_model_path)
    return ["config.json", "model.safetensors", *(f"{ADAPTER_DIR}/{name}" for name in adapter)]
