"""`dynarl bench rollout`: the native rollout engine against transformers' generate().

Both run the same tiny Qwen2 weights on the same 64 prompts with the same per-request
output lengths (a capped log-normal long tail, forced through max_new_tokens with no
stop token), sampling at temperature 1. `hf_tok_s` / `speedup_vs_hf` compare with
one generate() call over the batch, which is how generate() batches requests whose
lengths are unknown (as in RL rollouts): padded to the longest. For reference the
bench also times an oracle HF schedule, 4 length-sorted buckets that know every output
length in advance (`speedup_vs_hf_oracle_buckets`), which no rollout can do.
Each side runs `--repeats` times, interleaved, and its best time counts, because the
machine may be shared.

A second workload, 16 four-turn conversations (each turn's prompt = the previous
prompt + answer + a new user message, all after a shared system prompt), measures the
share of prefill tokens served from the prefix cache.

`--backends native,vllm,sglang` instead runs the rollout engines side by side, each
through its dynarl adapter in an interpreter that imports it (rollout_backends.py).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from typing import Any

import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine


def make_workload(rng: random.Random, num: int, vocab: int, max_len: int) -> tuple[list[list[int]], list[int]]:
    prompts = [[rng.randrange(3, vocab) for _ in range(rng.randint(16, 64))] for _ in range(num)]
    lengths = [max(4, min(max_len, int(rng.lognormvariate(math.log(32), 1.0)))) for _ in range(num)]
    return prompts, lengths


def run_native(model, prompts, lengths, block_size: int = 16) -> tuple[float, int]:
    need = sum(-(-(len(p) + n) // block_size) for p, n in zip(prompts, lengths))
    engine = NativeRolloutEngine(model, NativeEngineConfig(block_size=block_size, num_blocks=need + 8,
                                                           max_num_seqs=len(prompts)))
    requests = [GenerationRequest(f"r{i}", p, SamplingParams(temperature=1.0, max_new_tokens=n, seed=i))
                for i, (p, n) in enumerate(zip(prompts, lengths))]
    start = time.perf_counter()
    results = asyncio.run(engine.generate(requests))
    elapsed = time.perf_counter() - start
    assert [len(r.output_token_ids) for r in results] == lengths
    return elapsed, engine.stats().preemptions


def hf_model(model: Qwen2ForCausalLM):
    import transformers

    fields = {k: v for k, v in model.config.to_hf_dict().items() if k not in ("architectures", "model_type")}
    reference = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**fields)).eval()
    reference.load_state_dict(model.state_dict())
    return reference


def hf_generate(reference, prompts: list[list[int]], new_tokens: int) -> None:
    import transformers

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding, as HF generate wants
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = transformers.GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True,
                                           temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        out = reference.generate(ids, attention_mask=mask, generation_config=config)
    assert out.shape == (len(prompts), width + new_tokens)


def run_hf(reference, prompts, lengths, strategy: str, num_buckets: int = 4) -> float:
    """pad: one batch to the longest length. buckets: sort by length, equal-count groups,
    each generated to its own longest length."""
    start = time.perf_counter()
    if strategy == "pad":
        hf_generate(reference, prompts, max(lengths))
    else:
        order = sorted(range(len(prompts)), key=lambda i: lengths[i])
        size = -(-len(order) // num_buckets)
        for b in range(0, len(order), size):
            group = order[b:b + size]
            hf_generate(reference, [prompts[i] for i in group], max(lengths[i] for i in group))
    return time.perf_counter() - start


def run_multiturn(model, rng: random.Random, vocab: int, conversations: int = 16, turns: int = 4,
                  answer_len: int = 32) -> dict[str, float]:
    engine = NativeRolloutEngine(model, NativeEngineConfig(block_size=16, num_blocks=2048))
    system = [rng.randrange(3, vocab) for _ in range(32)]
    history = [list(system) for _ in range(conversations)]
    cached_by_turn = []
    for turn in range(turns):
        requests = []
        for c in range(conversations):
            history[c] += [rng.randrange(3, vocab) for _ in range(rng.randint(16, 40))]  # the user's message
            requests.append(GenerationRequest(f"c{c}t{turn}", list(history[c]),
                                              SamplingParams(max_new_tokens=answer_len, seed=c * 100 + turn)))
        results = asyncio.run(engine.generate(requests))
        for c, r in enumerate(results):
            history[c] += r.output_token_ids
        cached_by_turn.append(sum(r.cached_tokens for r in results))
    stats = engine.stats()
    return {"prefill_saved_frac": stats.cached_prefill_tokens / stats.prefill_tokens,
            "prefill_tokens": stats.prefill_tokens, "cached_prefill_tokens": stats.cached_prefill_tokens,
            "cached_tokens_by_turn": cached_by_turn}


def backends_workload(args: argparse.Namespace) -> dict[str, Any]:
    """--backends: the model, prompts and output lengths every backend's child runs."""
    prompts, lengths = make_workload(random.Random(args.seed), args.requests, TINY_CONFIGS[args.model].vocab_size,
                                     args.max_len)
    return {"model": args.model, "seed": args.seed, "prompts": prompts, "lengths": lengths, "repeats": args.repeats,
            "threads": args.threads, "temperature": args.temperature}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", default="tiny-1m", choices=sorted(TINY_CONFIGS))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=384, help="cap of the output-length long tail")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for both sides (1 keeps a shared 2-core machine's numbers stable); "
                             "--backends: OMP_NUM_THREADS of every engine process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", default=None,
                        help="comma-separated rollout backends (native, vllm, sglang) to compare instead, same "
                             "model, prompts and output lengths, each in an interpreter that imports it")
    parser.add_argument("--temperature", type=float, default=1.0, help="--backends only: 0 is greedy")
    parser.add_argument("--timeout-s", type=float, default=1800.0,
                        help="--backends only: a backend's measurement (start included) is stopped after this")
    args = parser.parse_args(argv)
    if args.backends is not None:
        from dynarl.launch.bench.rollout_backends import run
        return run(args, backends_workload(args))

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(TINY_CONFIGS[args.model]).eval()
    reference = hf_model(model)
    rng = random.Random(args.seed)
    prompts, lengths = make_workload(rng, args.requests, model.config.vocab_size, args.max_len)
    run_native(model, prompts[:8], [8] * 8)  # warm-up both paths
    hf_generate(reference, prompts[:8], 8)

    native, hf = [], {"pad": [], "buckets": []}
    preemptions = 0
    for _ in range(args.repeats):
        elapsed, preemptions = run_native(model, prompts, lengths)
        native.append(elapsed)
        for strategy in hf:
            hf[strategy].append(run_hf(reference, prompts, lengths, strategy))
    tokens = sum(lengths)
    result = {
        "native_tok_s": tokens / min(native),
        "hf_tok_s": tokens / min(hf["pad"]),
        "speedup_vs_hf": min(hf["pad"]) / min(native),
        "hf_oracle_buckets_tok_s": tokens / min(hf["buckets"]),
        "speedup_vs_hf_oracle_buckets": min(hf["buckets"]) / min(native),
        "output_tokens": tokens,
        "max_output_len": max(lengths),
        "median_output_len": sorted(lengths)[len(lengths) // 2],
        "native_preemptions": preemptions,
        **run_multiturn(model, rng, model.config.vocab_size),
        "model": args.model, "requests": args.requests, "threads": args.threads, "repeats": args.repeats,
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>24}  {value:.3f}" if isinstance(value, float) else f"{key:>24}  {value}")
    return 0
