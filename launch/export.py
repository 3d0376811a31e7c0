"""`dynarl export RUN_DIR OUT_DIR [--step N]`: a run's trained policy as an HF folder.

A native trainer's checkpoint (components/workflows/checkpoints.py) holds its FSDP2
shards, written with torch.distributed.checkpoint: the fp32 weights and Adam moments
split by rows over the data-parallel ranks (components/trainer/native/checkpoint.py);
the export reads the whole weights back in one process. A megatron trainer's holds each rank's TP slice
by megatron name (components/trainer/megatron/checkpoint.py); the export joins one
replica's slices and converts the names. Either way the weights go into the run's
model (its config.yaml's `model`), and the export writes config.json, model.safetensors and
generation_config.json (a LoRA run, model.lora: the adapters merged into the weights, and
the adapter itself in PEFT's format under adapter/, which
`peft.PeftModel.from_pretrained(base, OUT_DIR/adapter)` loads), plus the tokenizer and chat
template files of `model.path` (TOKENIZER_FILES) when the run started from a folder (for
the built-in model, its character tokenizer's own file). The result loads with
`transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`, and as `model.path`.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "added_tokens.json", "tokenizer.model", "chat_template.jinja", "chat_template.json")
"""What a model folder's tokenizer and chat template are read from: newer transformers
save the chat template beside tokenizer_config.json (chat_template.jinja, or .json),
sentencepiece models keep tokenizer.model."""


class ExportError(ValueError):
    """The run or the step cannot be exported (the message says why)."""


def pick_checkpoint(run_dir: str, step: int | None) -> tuple[str, object]:
    """The checkpoint of RL step `step` (trained steps 0..step-1), or the newest that
    verifies (components/workflows/checkpoints.py); one that does not is refused."""
    from dynarl.components.workflows import checkpoints as ckpt
    found = [f for f in ckpt.scan(run_dir) if f.status != "incomplete"]
    if not found:
        raise ExportError(f"{run_dir} has no complete checkpoint (run.checkpoint_every sets how often one is "
                          "written; the last step always gets one)")
    if step is None:
        chosen = ckpt.choose_resume(found, ckpt.problem).chosen
        if chosen is None:
            raise ExportError(f"no checkpoint in {run_dir} verifies: {ckpt.problem(found[-1])} ({found[-1].path})")
        return chosen.path, ckpt.read_state(chosen.path)
    for f in found:
        if f.step == step:
            wrong = ckpt.problem(f)
            if wrong is not None:
                raise ExportError(f"checkpoint {f.path} failed verification: {wrong}")
            return f.path, ckpt.read_state(f.path)
    raise ExportError(f"no checkpoint of step {step} in {run_dir}; there are: "
                      f"{', '.join(str(f.step) for f in found)}")


def policy_weights(path: str, model: object) -> list[tuple[str, object]]:
    """(HF name, fp32 tensor) for every weight of the checkpoint at `path`, from either
    trainer's format."""
    from dynarl.components.trainer.megatron import checkpoint as megatron_checkpoint
    if os.path.isfile(os.path.join(path, megatron_checkpoint.META_FILE)):
        return list(megatron_checkpoint.hf_weights(path, model))
    return master_weights(path)


def master_weights(path: str) -> list[tuple[str, object]]:
    """(parameter name, fp32 tensor) for every parameter, joined from every rank's
    shards (DCP, in this one process)."""
    import torch

    from dynarl.components.trainer.native import checkpoint
    names = checkpoint.load_meta(path)["params"]
    weights = checkpoint.read_weights(path, {name: torch.zeros(shape) for name, shape in names})
    return [(name, weights[name]) for name, _ in names]


def write_weights(model: object, spec: object, weights: list[tuple[str, object]], out_dir: str,
                  base: str | None = None) -> list[str]:
    """The checkpoint's `weights` (HF name, tensor) into `model` (build_policy_model's:
    LoRA-adapted when spec.lora is on), then written: config.json + model.safetensors,
    the adapters merged in, and for LoRA the adapter in PEFT's format under adapter/
    (components/model/lora_export.py). A LoRA checkpoint must hold every adapter; base
    weights it leaves out keep the run's starting values (frozen, so the trained ones).
    `base`: the adapter's base model folder (default model.path)."""
    from dynarl.components.model.io import load_weights, save_pretrained
    from dynarl.components.model.lora import is_adapter
    from dynarl.components.model.lora_export import write_lora_export

    lora = spec.lora
    if not lora.enabled:
        load_weights(model, weights, strict=True)
        save_pretrained(model, out_dir)
        return ["config.json", "model.safetensors"]
    loaded = set(load_weights(model, weights))
    named = dict(model.named_parameters())
    missing = [name for name in named if is_adapter(name) and name not in loaded]
    if missing:
        raise ExportError(f"the run's model.lora has adapters the checkpoint lacks ({missing[0]}, "
                          f"{len(missing)} in all): was it written by a LoRA run?")
    base = base or (os.path.abspath(spec.path) if spec.path else None)
    return write_lora_export(named, model.config, lora, out_dir, base)


def copy_tokenizer_files(source: str, out_dir: str) -> list[str]:
    """The tokenizer and chat template files of model folder `source` copied into
    `out_dir`; returns the names copied."""
    copied = []
    for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(source, name)):
            shutil.copy(os.path.join(source, name), out_dir)
            copied.append(name)
    return copied


def export(run_dir: str, out_dir: str, step: int | None = None) -> dict:
    from dynarl.components.model.spec import build_policy_model
    from dynarl.launch.train import resolve_config

    if not os.path.isfile(os.path.join(run_dir, "config.yaml")):
        raise ExportError(f"{run_dir} is not a run directory (no config.yaml)")
    cfg = resolve_config(None, [], run_dir)
    path, state = pick_checkpoint(run_dir, step)
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ExportError(f"{out_dir} exists and is not empty")
    model = build_policy_model(cfg.model)
    from dynarl.components.workflows.job import LORA_BASE
    lora_base = os.path.join(os.path.abspath(run_dir), LORA_BASE)  # (a LoRA run's warm-started base)
    written = write_weights(model, cfg.model, policy_weights(path, model.config), out_dir,
                            lora_base if os.path.isdir(lora_base) else None)
    c = model.config
    source = cfg.model.path
    if source and os.path.isfile(os.path.join(source, "generation_config.json")):
        shutil.copy(os.path.join(source, "generation_config.json"), out_dir)
    else:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump({"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id,
                       "pad_token_id": c.pad_token_id}, f, indent=2)
    written.append("generation_config.json")
    if source:
        written += copy_tokenizer_files(source, out_dir)
    else:  # the built-in model's character tokenizer, which dynarl (not transformers) reads back
        from dynarl.components.model.spec import build_tokenizer
        from dynarl.components.model.tokenizer import CHAR_TOKENIZER_FILE
        build_tokenizer(cfg.model).save(out_dir)
        written.append(CHAR_TOKENIZER_FILE)
    return {"checkpoint": path, "step": state.step, "trainer_step": state.trainer_step, "files": written,
            "tokenizer": bool(source)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--step", type=int, help="the checkpoint of this RL step (default: the newest)")
    args = parser.parse_args(argv)
    try:
        done = export(args.run_dir, args.out_dir, args.step)
    except (ExportError, FileNotFoundError) as exc:
        print(f"dynarl export: {exc}", file=sys.stderr)
        return 2
    print(f"exported step {done['step']} (optimizer step {done['trainer_step']}) of {args.run_dir} to "
          f"{args.out_dir}: {', '.join(done['files'])}")
    if not done["tokenizer"]:
        print("the built-in model's character tokenizer has no HF form: its own file is written, which "
              "`dynarl train model.path=` and `dynarl eval` read (transformers does not)")
    print(f"load it with: transformers.AutoModelForCausalLM.from_pretrained({args.out_dir!r})")
    return 0
