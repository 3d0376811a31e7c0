"""`dynarl bench memory`: the memory plan (components/memory) against the peak each
native engine reaches on CPU, at three model sizes, side by side in one run.

    dynarl bench memory [--json] [--sizes small,medium,large] [--components trainer,rollout,inference]

Each (size, component) runs in a fresh subprocess (`--worker`): it builds its inputs,
resets the kernel's peak-RSS mark (/proc/self/clear_refs, 5), builds the engine on
CPU in float32 and runs one phase of it (a train step; a rollout of a batch of
requests; a log-prob pass), then reads the peak (VmHWM). Measured = the peak minus
the RSS just before the build. Planned = what the plan puts on a CPU device for that
rank in its own phase (held + working, components/memory/engines.py), from the same
config. glibc's mmap threshold is pinned (MALLOC_MMAP_THRESHOLD_) so freed tensors go
back to the kernel at once and the RSS follows the live bytes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

SIZES = {
    # name: (hidden, layers, heads, kv_heads, intermediate, vocab)
    "small": (256, 4, 4, 2, 768, 8192),
    "medium": (512, 8, 8, 2, 1536, 16384),
    "large": (768, 12, 12, 4, 2304, 32768),
}
"""Three Qwen2-shaped decoders, about 7M, 47M and 150M parameters."""
COMPONENTS = ("trainer", "rollout", "inference")
MICRO_BATCH, PROMPT, RESPONSE = 4, 64, 192
"""The trainer's and inference's micro-batch and its sequences (prompt + response tokens)."""
ROLLOUT = {"num_blocks": 256, "block_size": 16, "max_num_seqs": 16, "max_prefill_tokens": 1024}
"""The native rollout engine's settings; 16 requests of PROMPT tokens, 32 new tokens each."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynarl bench memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--components", default=",".join(COMPONENTS), help="comma-separated, of "
                        + ", ".join(COMPONENTS))
    parser.add_argument("--worker", nargs=2, metavar=("SIZE", "COMPONENT"), help=argparse.SUPPRESS)
    return parser


def model_config(size: str):
    from dynarl.components.model.config import ModelConfig
    h, layers, heads, kv, inter, vocab = SIZES[size]
    return ModelConfig(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024)


def train_config():
    """The `dynarl train` config whose plan the bench checks (CPU devices, one rank each)."""
    from dynarl.components.workflows.config import load_config
    engine = ROLLOUT | {"max_model_len": 1024}
    return load_config({"runtime": {"cluster": {"devices_per_node": 1}},
                        "rollout": {"num_ranks": 1, "max_new_tokens": RESPONSE, "engine": engine},
                        "inference": {"num_ranks": 1, "micro_batch_size": MICRO_BATCH},
                        "trainer": {"num_ranks": 1, "engine": {"micro_batch_size": MICRO_BATCH,
                                                               "entropy_coef": 0.02}},
                        "memory": {"prompt_tokens": PROMPT}})


def planned(size: str, component: str) -> dict[str, int]:
    """The plan's parts for one rank of `component` in its own phase on a CPU device."""
    from dynarl.components.memory import engines as e
    cfg, m = train_config(), model_config(size)
    shape = e.Shape("cpu", 0, PROMPT + RESPONSE)
    held, working = {"trainer": lambda: e.native_trainer(cfg, m, shape, 1),
                     "rollout": lambda: e.native_rollout(cfg, m, shape),
                     "inference": lambda: e.native_inference(cfg, m, shape)}[component]()
    return {**held, **working}


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(size: str, component: str) -> int:
    """Bytes the engine adds at its peak (this process; call in a fresh one)."""
    import asyncio
    import random

    import torch
    torch.set_num_threads(1)
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.base import TrainBatch, TrainerConfig
    m = model_config(size)
    rng = random.Random(0)
    ids = [[rng.randrange(3, m.vocab_size) for _ in range(PROMPT + RESPONSE)] for _ in range(MICRO_BATCH)]
    if component == "rollout":
        from dynarl.components.rollout.base import GenerationRequest, SamplingParams
        from dynarl.components.rollout.native.config import NativeEngineConfig
        from dynarl.components.rollout.native.engine import NativeRolloutEngine
        requests = [GenerationRequest(f"r{i}", ids[i % MICRO_BATCH][:PROMPT],
                                      SamplingParams(max_new_tokens=32, seed=i, ignore_eos=True)
                                      if "ignore_eos" in SamplingParams.__dataclass_fields__
                                      else SamplingParams(max_new_tokens=32, seed=i))
                    for i in range(ROLLOUT["max_num_seqs"])]
    import gc
    gc.collect()
    base = _rss()
    _reset_peak()
    model = Qwen2ForCausalLM(m)
    if component == "trainer":
        from dynarl.components.trainer.native.trainer import NativeTrainer
        trainer = NativeTrainer(model, TrainerConfig(micro_batch_size=MICRO_BATCH, entropy_coef=0.02))
        trainer.train_step(TrainBatch(input_ids=ids, prompt_lens=[PROMPT] * MICRO_BATCH,
                                      advantages=[1.0, -1.0] * (MICRO_BATCH // 2)))
    elif component == "rollout":
        engine = NativeRolloutEngine(model, NativeEngineConfig(**ROLLOUT))
        asyncio.run(engine.generate(requests))
    else:
        from dynarl.components.inference.native import NativeInference
        engine = NativeInference(model, MICRO_BATCH)
        asyncio.run(engine.logprobs([i[:PROMPT] for i in ids], [i[PROMPT:] for i in ids]))
    return _peak() - base


def _run_worker(size: str, component: str) -> int:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.bench.memory", "--worker", size, component],
                         capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"bench memory worker {size} {component} failed:\n{out.stderr[-2000:]}")
    return int(out.stdout.strip().splitlines()[-1])


def run(sizes: list[str], components: list[str]) -> list[dict]:
    rows = []
    for size in sizes:
        params = model_config(size).num_parameters
        for component in components:
            parts = planned(size, component)
            plan = sum(parts.values())
            measured = _run_worker(size, component)
            rows.append({"size": size, "params": params, "component": component, "planned_bytes": plan,
                         "measured_bytes": measured, "ratio": measured / plan, "parts": parts})
    return rows


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        print(measure(*args.worker))
        return 0
    sizes, components = args.sizes.split(","), args.components.split(",")
    for name in sizes:
        if name not in SIZES:
            print(f"dynarl bench memory: unknown size {name!r}; choose from {', '.join(SIZES)}", file=sys.stderr)
            return 2
    for name in components:
        if name not in COMPONENTS:
            print(f"dynarl bench memory: unknown component {name!r}; choose from {', '.join(COMPONENTS)}",
                  file=sys.stderr)
            return 2
    rows = run(sizes, components)
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'size':<7} {'params':>8} {'component':<10} {'planned MB':>11} {'measured MB':>12} {'measured/plan':>14}")
    for r in rows:
        print(f"{r['size']:<7} {r['params'] / 1e6:>7.1f}M {r['component']:<10} {r['planned_bytes'] / 1e6:>11.1f} "
              f"{r['measured_bytes'] / 1e6:>12.1f} {r['ratio']:>14.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
