"""Qwen2, Qwen3 and Llama checkpoints in and out: a tiny random HF folder of each (built
here with transformers) trains 3 GRPO steps on a GSM8K-format file
(task.dataset.preset=gsm8k), is exported, and the export loads in transformers with
dynarl's logits."""
NUM_GPUS = 0

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from dynarl.components.model.config import ModelConfig
from dynarl.components.model.io import load_pretrained
from dynarl.components.model.tokenizer import CharTokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHAPE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ARCHITECTURES = {
    "qwen2": ModelConfig(**SHAPE),
    "qwen3": ModelConfig(**SHAPE, model_type="qwen3", attention_bias=False, qk_norm=True, explicit_head_dim=32),
    "llama": ModelConfig(**SHAPE, model_type="llama", attention_bias=False, rope_llama3=(8.0, 1.0, 4.0, 256)),
}


def hf_folder(path, config: ModelConfig) -> None:
    """transformers' own random model of `config`, saved by transformers, with the
    character tokenizer dynarl reads (its vocabulary fits in 128)."""
    fields = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(config.model_type,
                                                                                             **fields))
    model.save_pretrained(path)
    CharTokenizer().save(path)


def gsm8k_file(path) -> None:
    with open(path, "w") as f:
        for i in range(20):
            f.write(json.dumps({"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) + "\n")


@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_a_checkpoint_trains_exports_and_loads_in_transformers(tmp_path, architecture):
    config = ARCHITECTURES[architecture]
    hf_folder(tmp_path / "model", config)
    gsm8k_file(tmp_path / "gsm8k.jsonl")
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", f"model.path={tmp_path / 'model'}",
                           "task.kind=dataset", "task.dataset.preset=gsm8k", f"task.dataset.path={tmp_path / 'gsm8k.jsonl'}",
                           "run.steps=3", "run.prompts_per_step=4", "rollout.samples_per_prompt=4",
                           "rollout.max_new_tokens=16", "trainer.warmup.steps=2", "--run-dir", str(run)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    out = tmp_path / "export"
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "export", str(run), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    assert type(theirs).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                     "llama": "LlamaForCausalLM"}[architecture]
    ours = load_pretrained(out).eval()
    assert ours.config == config
    start = dict(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "model").named_parameters())
    assert any(not torch.equal(p, start[n]) for n, p in theirs.named_parameters())  # it was trained
    ids = torch.randint(3, 100, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(ids), atol=1e-5, rtol=0)
