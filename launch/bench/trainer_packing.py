"""Padded vs packed micro-batches, side by side (part of `dynarl bench trainer`).

One built-in long-tailed GRPO batch (response lengths Pareto-distributed: most short,
a few at the maximum, as RL rollouts are), one model, one process, one torch thread:
the same samples trained as padded micro-batches of `micro_batch_size` rows and as
packed ones of at most `max_tokens` tokens (trainer.max_tokens_per_micro_batch).
Timed: forward + GRPO loss (losses.micro_batch_loss) + backward of every micro-batch,
the two layouts alternating round by round; micro-batches are built before the clock.
"""
from __future__ import annotations

import random
import time


def long_tailed_batch(samples: int, prompt_len: int, max_response: int, vocab: int, seed: int = 0):
    """GRPO groups of 4; response lengths 8 * Pareto(alpha 1), capped at max_response."""
    from dynarl.components.trainer.base import TrainBatch
    rng = random.Random(seed)
    ids, rewards, groups = [], [], []
    for i in range(samples):
        if i % 4 == 0:
            prompt = [rng.randrange(3, vocab) for _ in range(prompt_len)]
        response = min(max_response, int(8 * rng.paretovariate(1.0)))
        ids.append(prompt + [rng.randrange(3, vocab) for _ in range(response)])
        rewards.append(float(rng.random() < 0.5))
        groups.append(i // 4)
    return TrainBatch(input_ids=ids, prompt_lens=[prompt_len] * samples, rewards=rewards, group_ids=groups)


def _pass(model, mbs, config, num_tokens: int) -> None:
    """Forward/backward of every micro-batch, gradients accumulating (as a step's)."""
    import torch
    from dynarl.components.trainer.native.losses import entropy_from_logprobs, micro_batch_loss
    model.zero_grad(set_to_none=True)
    for mb in mbs:
        if not mb.num_tokens:
            continue
        logp = torch.log_softmax(mb.logits(model)[:, :-1][mb.loss_mask].float(), dim=-1)
        logprobs = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        micro_batch_loss(logprobs, entropy_from_logprobs(logp), mb, config, num_tokens).loss.backward()


def measure_packing(model_name: str, samples: int, prompt_len: int, max_response: int,
                    micro_batch_size: int, max_tokens: int, rounds: int) -> dict:
    """tokens/s (response tokens in the loss) of padded and packed passes over the same
    batch, and their ratio `packed_speedup`; best round of each."""
    import torch
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.native.losses import step_advantages
    from dynarl.components.trainer.native.micro_batch import micro_batches
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(TINY_CONFIGS[model_name])
    model.train()
    batch = long_tailed_batch(samples, prompt_len, max_response, model.config.vocab_size)
    device = torch.device("cpu")
    configs = {"padded": TrainerConfig(micro_batch_size=micro_batch_size, entropy_coef=0.01,
                                       max_tokens_per_micro_batch=0),
               "packed": TrainerConfig(micro_batch_size=micro_batch_size, entropy_coef=0.01,
                                       max_tokens_per_micro_batch=max_tokens)}
    advantages = step_advantages(batch, configs["padded"])
    layouts = {name: micro_batches(batch, advantages, cfg, device) for name, cfg in configs.items()}
    num_tokens = batch.num_loss_tokens()
    for name, mbs in layouts.items():  # warm-up, not counted
        _pass(model, mbs, configs[name], num_tokens)
    best = {name: float("inf") for name in layouts}
    for _ in range(rounds):
        for name, mbs in layouts.items():
            start = time.perf_counter()
            _pass(model, mbs, configs[name], num_tokens)
            best[name] = min(best[name], time.perf_counter() - start)
    lengths = [len(ids) for ids in batch.input_ids]
    padded_slots = sum(len(mb.rows) * mb.input_ids.shape[1] for mb in layouts["padded"])
    return {
        "pack_samples": samples, "pack_max_tokens": max_tokens, "pack_micro_batch_size": micro_batch_size,
        "pack_rounds": rounds, "pack_loss_tokens": num_tokens, "pack_seq_tokens": sum(lengths),
        "pack_seq_len_median": sorted(lengths)[len(lengths) // 2], "pack_seq_len_max": max(lengths),
        "pack_padded_fill": round(sum(lengths) / padded_slots, 3),
        "pack_micro_batches": {name: len(mbs) for name, mbs in layouts.items()},
        "tokens_per_s_padded": round(num_tokens / best["padded"], 1),
        "tokens_per_s_packed": round(num_tokens / best["packed"], 1),
        "packed_speedup": round(best["padded"] / best["packed"], 3),
    }
