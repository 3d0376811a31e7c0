"""Trainer benchmark: the native (FSDP2) trainer's GRPO step throughput and the state
each rank holds at DP 1, 2 and 4 (gloo, same global batch), the time to export then
import a rank's sharded state; padded vs packed micro-batches on a long-tailed batch
(trainer_packing.py); and the activations one forward keeps for its backward, with and
without activation checkpointing. All side by side in one run.

    dynarl bench trainer [--json] [--model tiny-0.5m] [--steps 6] [--batch 32] [--packing-only]
                         [--ckpt-seq-len 1024]

Every rank runs one torch thread. The DP=2 and DP=4 ranks are subprocesses of this
command (`--worker-rank`), joined as the runtime joins trainer ranks
(transport/process_group.py) over a TCPStore hosted here on a free port, and always
reaped before it returns. Results travel back as JSON files, never pickle. State per
rank = the rank's rows of the fp32 weights, of their gradients and of AdamW's two
moments (FSDP2: about 1/N of the whole); peak RSS adds what every process holds
(torch itself, activations).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

WORLDS = (2, 4)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynarl bench trainer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--model", default="tiny-0.5m", help="a key of TINY_CONFIGS")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (after one warm-up step)")
    parser.add_argument("--batch", type=int, default=32, help="global batch, samples (groups of 4)")
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--response-len", type=int, default=48)
    parser.add_argument("--packing-only", action="store_true", help="only padded vs packed micro-batches")
    parser.add_argument("--pack-samples", type=int, default=64, help="long-tailed batch, samples")
    parser.add_argument("--pack-max-response", type=int, default=512, help="its longest response")
    parser.add_argument("--pack-max-tokens", type=int, default=1024, help="max_tokens_per_micro_batch")
    parser.add_argument("--pack-rounds", type=int, default=3, help="timed rounds of each (best kept)")
    parser.add_argument("--ckpt-seq-len", type=int, default=1024,
                        help="tokens of the activation-checkpointing memory measure (batch 1)")
    parser.add_argument("--worker-rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser


def _batch(args: argparse.Namespace, step: int, vocab: int):
    from dynarl.components.trainer.base import TrainBatch
    rng = random.Random(step)
    ids, rewards, groups = [], [], []
    for i in range(args.batch):
        if i % 4 == 0:
            prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_len)]
        ids.append(prompt + [rng.randrange(3, vocab) for _ in range(args.response_len)])
        rewards.append(float(rng.random() < 0.5))
        groups.append(i // 4)
    return TrainBatch(input_ids=ids, prompt_lens=[args.prompt_len] * args.batch, rewards=rewards, group_ids=groups)


def _trainer(args: argparse.Namespace, group=None, seed: int = 0):
    import torch
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.native.trainer import NativeTrainer
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(TINY_CONFIGS[args.model])
    config = TrainerConfig(lr=1e-4, micro_batch_size=8, entropy_coef=0.01)
    return NativeTrainer(model, config, group)


def _timed_steps(args: argparse.Namespace, trainer, rank: int, world: int, barrier) -> tuple[float, int]:
    """(seconds for args.steps steps after a warm-up, response tokens trained)."""
    from dynarl.components.model.config import TINY_CONFIGS
    vocab = TINY_CONFIGS[args.model].vocab_size
    trainer.train_step(_batch(args, 0, vocab).shard(rank, world))
    barrier()
    start, tokens = time.perf_counter(), 0
    for step in range(1, args.steps + 1):
        tokens += trainer.train_step(_batch(args, step, vocab).shard(rank, world)).tokens
    barrier()
    return time.perf_counter() - start, tokens


def _state_bytes(trainer) -> int:
    """This rank's weights, gradients (the same rows) and both moments, in bytes."""
    shard = trainer.export_state_shard()
    weights = sum(t.numel() * t.element_size() for k, t in shard.items() if k.startswith("param/"))
    return weights + sum(t.numel() * t.element_size() for k, t in shard.items() if k.startswith("exp_avg"))\
        + weights


def _worker(args: argparse.Namespace) -> int:
    """One DP rank: timed steps, its state's size, then an export -> import on a fresh rank."""
    import resource

    import torch
    import torch.distributed as dist

    from dynarl.transport.process_group import join_group
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", args.port, is_master=False, timeout=timedelta(seconds=120))
    member = join_group(f"bench{args.world}", f"bench/{args.world}/", args.worker_rank, args.world, "127.0.0.1",
                        args.port, "gloo", 120.0, store=store, secret=b"bench" * 8)
    group = member.group
    barrier = lambda: dist.all_reduce(torch.zeros(1), group=group)  # noqa: E731
    trainer = _trainer(args, group)
    seconds, tokens = _timed_steps(args, trainer, args.worker_rank, args.world, barrier)
    fresh = _trainer(args, group, seed=1)
    barrier()
    start = time.perf_counter()
    fresh.import_state_shard({k: v.clone() for k, v in trainer.export_state_shard().items()})
    barrier()
    export_import_s = time.perf_counter() - start
    with open(args.out, "w") as f:
        json.dump({"seconds": seconds, "tokens": tokens, "export_import_s": export_import_s,
                   "state_bytes": _state_bytes(trainer),
                   "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}, f)
    return 0


def _run_dp(args: argparse.Namespace, world: int, workdir: str) -> list[dict]:
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=120))
    forwarded = ["--model", args.model, "--steps", str(args.steps), "--batch", str(args.batch),
                 "--prompt-len", str(args.prompt_len), "--response-len", str(args.response_len)]
    outs = [os.path.join(workdir, f"dp{world}-rank{r}.json") for r in range(world)]
    procs = []
    try:
        for rank in range(world):
            cmd = [sys.executable, "-m", "dynarl.launch.bench.trainer", *forwarded, "--world", str(world),
                   "--worker-rank", str(rank), "--port", str(store.port), "--out", outs[rank]]
            procs.append(subprocess.Popen(cmd))
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:  # reap on every path, including a timeout or Ctrl-C
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(codes):
        raise RuntimeError(f"DP={world} ranks exited with codes {codes}")
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results


def _packing(args: argparse.Namespace) -> dict:
    from dynarl.launch.bench.trainer_packing import measure_packing
    return measure_packing(args.model, args.pack_samples, args.prompt_len, args.pack_max_response,
                           micro_batch_size=8, max_tokens=args.pack_max_tokens, rounds=args.pack_rounds)


def _activation_memory(args: argparse.Namespace) -> dict:
    """Activation checkpointing side by side on args.model, one sequence of --ckpt-seq-len
    tokens: the bytes one forward keeps for its backward (what autograd saves, counted
    once per storage, parameters left out; with checkpointing, each layer's input),
    which is what checkpointing reduces. The CPU allocator keeps no peak statistics."""
    import torch
    from torch.autograd.graph import saved_tensors_hooks
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM, set_activation_checkpointing
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(TINY_CONFIGS[args.model]).train()
    ids = torch.randint(3, model.config.vocab_size, (1, args.ckpt_seq_len + 1))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def saved_bytes(enabled: bool) -> int:
        set_activation_checkpointing(model, enabled)
        model.zero_grad(set_to_none=True)
        storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                storages[storage.data_ptr()] = storage.nbytes()
            return t
        with saved_tensors_hooks(pack, lambda t: t):  # (the recompute in the backward saves inside)
            logprobs = model(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None])
        logprobs.mean().backward()
        return sum(storages.values())
    plain, checkpointed = saved_bytes(False), saved_bytes(True)
    return {"ckpt_seq_len": args.ckpt_seq_len, "saved_activation_bytes": plain,
            "saved_activation_bytes_checkpointed": checkpointed,
            "checkpointed_over_plain": round(checkpointed / plain, 3)}


def _run(args: argparse.Namespace) -> dict:
    import torch
    torch.set_num_threads(1)
    packing = _packing(args)
    if args.packing_only:
        return {"model": args.model, "threads_per_rank": 1, "cpu_count": os.cpu_count(), **packing}
    single = _trainer(args)
    dp1_s, dp1_tokens = _timed_steps(args, single, 0, 1, lambda: None)
    numel, dp1_state = single.layout().total_numel, _state_bytes(single)
    del single
    with tempfile.TemporaryDirectory(prefix="dynarl-bench-trainer-") as workdir:
        ranks = {world: _run_dp(args, world, workdir) for world in WORLDS}
    result: dict = {"model": args.model, "params": numel, "global_batch": args.batch,
                    "sequence_len": args.prompt_len + args.response_len, "steps": args.steps, "threads_per_rank": 1,
                    "cpu_count": os.cpu_count(), "tokens_per_s_dp1": round(dp1_tokens / dp1_s, 1),
                    "state_bytes_per_rank_dp1": dp1_state}
    for world, rs in ranks.items():
        tokens = sum(r["tokens"] for r in rs) // world  # each rank reports the global count
        result[f"tokens_per_s_dp{world}"] = round(tokens / max(r["seconds"] for r in rs), 1)
        result[f"state_bytes_per_rank_dp{world}"] = max(r["state_bytes"] for r in rs)
        result[f"state_per_rank_dp{world}_over_dp1"] = round(max(r["state_bytes"] for r in rs) / dp1_state, 3)
        result[f"max_rss_mb_dp{world}"] = round(max(r["max_rss_mb"] for r in rs), 1)
    result["state_export_import_s"] = round(max(r["export_import_s"] for r in ranks[2]), 4)
    return {**result, **packing, **_activation_memory(args),
            "note": "tokens = response tokens in the loss; DP ranks are processes over gloo on this host"}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.worker_rank is not None:
        return _worker(args)
    result = _run(args)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
