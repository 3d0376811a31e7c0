"""The job `dynarl bench peers` runs on both sides: its files and its two command lines.

One GRPO job: a random-weight Qwen2 (hidden 128, 4 layers, about 1.04M parameters,
lm_head untied) saved as an HF folder with a byte-level BPE tokenizer trained here on
the task's own text, and 256 `a+b=` rows (the answer: the sum) in a JSONL file. A
step: 16 prompts x 8 samples, temperature 1.0, lr 3e-4 (constant), no KL, no entropy
bonus, no warm start, the math verifier's reward.

Two workloads (WORKLOADS):
- short: 32 new tokens; the random model rarely draws its EOS, so nearly every
  completion runs to 32.
- long: 256 new tokens with lengths spread by the model's own EOS. The folder's weights
  are edited so that the EOS logit carries a bias (eos_bias): one residual dimension is
  made a constant (its embedding column set to 1.0, every layer's writes to it zeroed),
  and the EOS row of lm_head alone reads it. Every step of every sample then stops with
  about the same probability: geometric lengths, most short, a tail to the cap. Both
  sides sample from the same weights; the bench measures the mean and max lengths each
  side actually generated.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

ROWS, EOS = 256, "<|endoftext|>"
HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB = 128, 4, 4, 2, 472, 1000


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    max_new_tokens: int
    eos_bias: float | None
    """None: the random weights as drawn; else the EOS logit's added bias (the long workload)."""
    default_steps: int
    """`dynarl bench peers` without --steps: the whole bench (both workloads, 2 pairs, TRL at
    two thread counts) in about 10-12 minutes on a 2-core machine; TRL's long steps take ~50 s."""


WORKLOADS = {"short": Workload("short", 32, None, 4), "long": Workload("long", 256, 2.0, 2)}
PROMPTS_PER_STEP, SAMPLES, LR, TEMPERATURE = 16, 8, 3e-4, 1.0


def rows(n: int = ROWS, seed: int = 0) -> list[dict[str, str]]:
    """`n` distinct-ish `a+b=` prompts (a, b in 0..99), the sum as the answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randrange(100), rng.randrange(100)
        out.append({"prompt": f"{a}+{b}=", "answer": str(a + b)})
    return out


def write_rows(path: Path, data: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


def train_tokenizer(data: list[dict[str, str]], vocab_size: int = VOCAB):
    """A byte-level BPE (`tokenizers`) trained on the rows' text, EOS its one special token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [r["prompt"] + r["answer"] for r in data] + [f"{a}+{b}={a + b}" for a in range(100) for b in range(100)]
    tok.train_from_iterator(texts, trainer)
    return tok


def model_config_kwargs(vocab_size: int, eos_id: int) -> dict:
    return dict(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                tie_word_embeddings=False, bos_token_id=None, eos_token_id=eos_id, pad_token_id=eos_id,
                torch_dtype="float32")


def bias_eos(model, eos_id: int, bias: float, dim: int = 0) -> None:
    """Give the EOS logit about `bias` over every other logit (see the module's docstring)."""
    import torch

    with torch.no_grad():
        model.model.embed_tokens.weight[:, dim] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[dim, :] = 0.0
            layer.mlp.down_proj.weight[dim, :] = 0.0
        model.lm_head.weight[:, dim] = 0.0
        # the final norm scales the constant 1.0 by 1/rms(x); measured on a forward pass
        ids = torch.arange(min(64, model.config.vocab_size)).unsqueeze(0)
        hidden = model.model(input_ids=ids).last_hidden_state[0, :, dim]
        model.lm_head.weight[eos_id, dim] = bias / float(hidden.mean())


def build_model_folder(folder: Path, workload: Workload, seed: int = 0) -> dict:
    """The HF folder (config, safetensors weights, tokenizer) of one workload; its facts."""
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(rows())
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(str(folder))
    eos_id = tok.token_to_id(EOS)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**model_config_kwargs(tok.get_vocab_size(), eos_id)))
    if workload.eos_bias is not None:
        bias_eos(model, eos_id, workload.eos_bias)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.save_pretrained(str(folder))
    return {"params": sum(p.numel() for p in model.parameters()), "vocab": tok.get_vocab_size(), "eos_id": eos_id}


def dynarl_argv(model: Path, data: Path, workload: Workload, steps: int, run_dir: Path, seed: int = 0) -> list[str]:
    """The `dynarl train` command line of the job (after `dynarl train`)."""
    return [f"model.path={model}", "task.kind=dataset", "task.dataset.preset=plain", f"task.dataset.path={data}",
            "task.verifier=math", f"run.steps={steps}", f"run.prompts_per_step={PROMPTS_PER_STEP}",
            f"rollout.samples_per_prompt={SAMPLES}", f"rollout.max_new_tokens={workload.max_new_tokens}",
            f"rollout.temperature={TEMPERATURE}", "trainer.warmup.steps=0", f"trainer.engine.lr={LR}",
            "trainer.engine.entropy_coef=0", "trainer.engine.kl_coef=0", f"run.seed={seed}",
            f"run.checkpoint_every={steps + 1}", "--run-dir", str(run_dir)]


@dataclass(frozen=True, slots=True)
class TrlSpec:
    """What the TRL child (peers_trl.py) reads: the same job in GRPOTrainer's terms."""
    model: str
    data: str
    out: str
    steps: int
    max_new_tokens: int
    threads: int | None
    """torch threads; None: torch's default."""
    seed: int = 0
    per_device_train_batch_size: int = PROMPTS_PER_STEP * SAMPLES // 2
    gradient_accumulation_steps: int = 2
    num_generations: int = SAMPLES
    lr: float = LR
    temperature: float = TEMPERATURE

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def trl_spec(model: Path, data: Path, workload: Workload, steps: int, out: Path, threads: int | None) -> TrlSpec:
    return TrlSpec(model=str(model), data=str(data), out=str(out), steps=steps,
                   max_new_tokens=workload.max_new_tokens, threads=threads)
