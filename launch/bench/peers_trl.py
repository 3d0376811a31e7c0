"""The TRL side of `dynarl bench peers`: one GRPOTrainer run in this process.

    python -m dynarl.launch.bench.peers_trl SPEC.json

SPEC.json is a TrlSpec (peers_job.py). GRPOTrainer generates with HF `generate`
(no vLLM) on CPU in float32, no gradient checkpointing, no reference model (beta 0),
a constant learning rate, TRL's default loss ('dapo': the token mean over the whole
batch, what dynarl's grpo computes) and its group-std reward scaling. One optimizer
step takes per_device_train_batch_size x gradient_accumulation_steps = 128 samples
(16 prompts x 8 generations), generated at once: dynarl's step. The reward is dynarl's
math verifier (components/reward), the one `task.verifier=math` uses.

Writes spec.out: a JSON object with per-step wall times (a TrainerCallback's
on_step_begin to on_step_end) and per-step mean reward and mean completion length
(from the trainer's logs, logging every step).
"""
from __future__ import annotations

import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        spec = json.load(f)
    import torch
    if spec["threads"]:
        torch.set_num_threads(int(spec["threads"]))
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from dynarl.components.reward.verifiers import MathVerifier

    verifier = MathVerifier()

    def math_reward(prompts, completions, answer, **_):
        return [verifier(c, a) for c, a in zip(completions, answer)]

    with open(spec["data"]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    steps: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            steps.append({"step": state.global_step, "step_s": time.perf_counter() - self.t0})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs and steps:
                steps[-1]["reward"] = logs["reward"]
                steps[-1]["mean_length"] = logs.get("completions/mean_length")
                steps[-1]["max_length"] = logs.get("completions/max_length")

    config = GRPOConfig(
        output_dir=spec["out"] + ".trainer", max_steps=spec["steps"], learning_rate=spec["lr"],
        lr_scheduler_type="constant", warmup_steps=0, per_device_train_batch_size=spec["per_device_train_batch_size"],
        gradient_accumulation_steps=spec["gradient_accumulation_steps"], num_generations=spec["num_generations"],
        max_completion_length=spec["max_new_tokens"], temperature=spec["temperature"], top_p=1.0, top_k=0,
        beta=0.0, bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False, report_to="none",
        logging_steps=1, save_strategy="no", seed=spec["seed"], dataloader_num_workers=0, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=config,
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[Timer()])
    trainer.train()
    with open(spec["out"], "w") as f:
        json.dump({"steps": steps, "threads": torch.get_num_threads()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
