"""`dynarl bench gpu`: the checks that need one CUDA GPU, as one command (under 8
minutes on an H200). Each part runs on its own and reports `ok` or its error, so one
failure does not hide the others:

    native      the native Qwen2 model, rollout engine and trainer on CUDA (bf16 model,
                a generate and a GRPO step)
    device_lock the rollout engine's release_memory/resume_memory and the trainer's
                offload/onload: device memory in use (torch.cuda.mem_get_info) before,
                released and back
    costmodel   prefill and decode-step times of the native engine at Qwen2.5-0.5B and
                -1.5B shapes (random weights, bf16) beside components/costmodel.py's
                prediction for the device (`--device`, default h200)
    megatron    (with dynarl[megatron]) a megatron-core GPTModel with megatron's own
                optimizer: a GRPO step, offload/onload memory, and its state
                exported and imported again (what a P2P reshard moves) unchanged
    p2p         two processes on the one GPU: a CUDA tensor sent peer-to-peer over NCCL
                (which may refuse two ranks on one device: "needs 2 GPUs"), and over gloo
                staged through host memory, as dynarl's gloo groups carry CUDA state

    dynarl bench gpu [--json] [--out FILE] [--parts native,device_lock,...] [--device h200]

Nothing here has run yet: no GPU was available when it was written (README, "What is
verified where").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable

import torch

PARTS = ("native", "device_lock", "costmodel", "megatron", "p2p")
SHAPES = {  # Qwen2.5 config.json values (HF Qwen/Qwen2.5-0.5B, -1.5B)
    "qwen2.5-0.5b": dict(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(vocab_size=151_936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True),
}


def used_gb() -> float:
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 1e9, 3)


def _model(shape: str | None = None, dtype: torch.dtype = torch.bfloat16) -> Any:
    from dynarl.components.model.config import TINY_CONFIGS, ModelConfig
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM

    config = ModelConfig(max_position_embeddings=4096, rope_theta=1e6, **SHAPES[shape]) if shape \
        else TINY_CONFIGS["tiny-4m"]
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).to(device="cuda", dtype=dtype).eval()


def _requests(num: int, prompt_len: int, new_tokens: int, vocab: int) -> list:
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(0)
    return [GenerationRequest(f"r{i}", torch.randint(3, vocab, (prompt_len,), generator=g).tolist(),
                              SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=i))
            for i in range(num)]


def _engine(model: Any, num_seqs: int, tokens_each: int) -> Any:
    """No prefix cache: every timed prompt is computed (the requests share seeds)."""
    from dynarl.components.rollout.native.engine import NativeEngineConfig, NativeRolloutEngine

    blocks = num_seqs * (-(-tokens_each // 16)) + 8
    return NativeRolloutEngine(model, NativeEngineConfig(num_blocks=blocks, max_num_seqs=num_seqs,
                                                         max_prefill_tokens=max(4096, tokens_each),
                                                         enable_prefix_cache=False))


def _batch(vocab: int, rows: int = 8, length: int = 64) -> Any:
    from dynarl.components.trainer.base import TrainBatch

    g = torch.Generator().manual_seed(1)
    return TrainBatch(input_ids=[torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(rows)],
                      prompt_lens=[length // 2] * rows, advantages=[1.0 if i % 2 else -1.0 for i in range(rows)])


def part_native(_: argparse.Namespace) -> dict:
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.native.trainer import NativeTrainer

    model = _model()
    engine = _engine(model, 16, 96)
    begun = time.perf_counter()
    results = asyncio.run(engine.generate(_requests(16, 32, 64, model.config.vocab_size)))
    generate_s = time.perf_counter() - begun
    trainer_model = _model(dtype=torch.float32).train()
    trainer = NativeTrainer(trainer_model, TrainerConfig(micro_batch_size=4))
    begun = time.perf_counter()
    metrics = trainer.train_step(_batch(model.config.vocab_size))
    torch.cuda.synchronize()
    return {"generate_s": round(generate_s, 4), "tokens": sum(len(r.output_token_ids) for r in results),
            "train_step_s": round(time.perf_counter() - begun, 4), "loss": metrics["loss"]}


def part_device_lock(_: argparse.Namespace) -> dict:
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.native.trainer import NativeTrainer

    out: dict[str, Any] = {}
    engine = _engine(_model("qwen2.5-0.5b"), 256, 2048)  # ~6.4 GB of KV (12 KiB a token)
    asyncio.run(engine.generate(_requests(4, 16, 8, 151_936)))
    out["rollout_gb"] = [used_gb()]
    asyncio.run(engine.release_memory())
    torch.cuda.empty_cache()
    out["rollout_gb"].append(used_gb())
    asyncio.run(engine.resume_memory())
    out["rollout_gb"].append(used_gb())
    del engine
    torch.cuda.empty_cache()
    trainer = NativeTrainer(_model("qwen2.5-0.5b", torch.float32).train(), TrainerConfig(micro_batch_size=4))
    trainer.train_step(_batch(151_936, rows=4, length=128))
    out["trainer_gb"] = [used_gb()]
    trainer.offload()
    torch.cuda.empty_cache()
    out["trainer_gb"].append(used_gb())
    trainer.onload()
    out["trainer_gb"].append(used_gb())
    out["freed_gb"] = {k: round(v[0] - v[1], 3) for k, v in (("rollout", out["rollout_gb"]),
                                                                ("trainer", out["trainer_gb"]))}
    return out


def part_costmodel(args: argparse.Namespace) -> dict:
    from dynarl.components import costmodel

    device = costmodel.get_device(args.device)
    out = {}
    for name in SHAPES:
        model = _model(name)
        p = sum(t.numel() for t in model.parameters())
        emb = model.config.vocab_size * model.config.hidden_size
        c = model.config
        shape = costmodel.ModelShape(name, p, p - emb, c.num_hidden_layers, c.num_attention_heads,
                                     c.num_key_value_heads, c.head_dim, c.hidden_size, c.vocab_size,
                                     c.intermediate_size, c.tie_word_embeddings)
        row = {"params": p}
        prompt, batch, context, steps = 2048, 64, 512, 64
        engine = _engine(model, batch, context + steps + 16)
        asyncio.run(engine.generate(_requests(2, 64, 4, c.vocab_size)))  # warm-up
        torch.cuda.synchronize()
        begun = time.perf_counter()
        asyncio.run(engine.generate(_requests(1, prompt, 1, c.vocab_size)))
        torch.cuda.synchronize()
        row["prefill_s"] = round(time.perf_counter() - begun, 5)
        row["prefill_predicted_s"] = round(costmodel.prefill_time(shape, device, prompt), 5)
        # decode: `batch` sequences of `context` prompt tokens; (all - prefill-only) / steps
        requests = _requests(batch, context, steps, c.vocab_size)
        begun = time.perf_counter()
        asyncio.run(engine.generate(requests))
        torch.cuda.synchronize()
        total = time.perf_counter() - begun
        prefill_only = _engine_time(model, batch, context)
        row["decode_step_s"] = round((total - prefill_only) / (steps - 1), 6)
        row["decode_step_predicted_s"] = round(costmodel.decode_step_time(shape, device, batch, context + steps / 2), 6)
        out[name] = row
        del model, engine
        torch.cuda.empty_cache()
    return out


def _engine_time(model: Any, batch: int, context: int) -> float:
    """The same requests with one output token: their prefill alone."""
    engine = _engine(model, batch, context + 16)
    torch.cuda.synchronize()
    begun = time.perf_counter()
    asyncio.run(engine.generate(_requests(batch, context, 1, model.config.vocab_size)))
    torch.cuda.synchronize()
    return time.perf_counter() - begun


def part_megatron(_: argparse.Namespace) -> dict:
    from dynarl.components.engine_factory import init_default_group
    from dynarl.components.model.config import TINY_CONFIGS
    from dynarl.components.trainer.base import TrainerConfig
    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer

    init_default_group(None)
    config = TINY_CONFIGS["tiny-4m"]
    trainer = MegatronTrainer(config, TrainerConfig(micro_batch_size=4), MegatronConfig())
    out: dict[str, Any] = {}
    try:
        begun = time.perf_counter()
        out["loss"] = trainer.train_step(_batch(config.vocab_size))["loss"]
        torch.cuda.synchronize()
        out["train_step_s"] = round(time.perf_counter() - begun, 4)
        out["gb"] = [used_gb()]
        trainer.offload()
        out["gb"].append(used_gb())
        trainer.onload()
        out["gb"].append(used_gb())
        # what a reshard or a checkpoint moves: saved after an offload/onload, a step
        # taken, the saved state put back and the same step taken again
        saved = {k: v.clone() for k, v in trainer.export_state_shard().items()}
        out["state_kinds"] = sorted({k.split("/", 1)[0] for k in saved if "/" in k})
        trainer.train_step(_batch(config.vocab_size))
        first = {n: w.float().clone() for n, w in trainer.local_weights().items()}
        trainer.import_state_shard(saved)
        trainer.train_step(_batch(config.vocab_size))
        out["restored_step_max_abs_diff"] = max(float((first[n] - w.float()).abs().max())
                                                for n, w in trainer.local_weights().items())
        out["adam_step"] = int(trainer.export_state_shard()["adam_step"])
    finally:
        trainer.close()
    return out


def _p2p_rank(rank: int, port: int, backend: str, numel: int, result: Any) -> None:
    import torch.distributed as dist

    torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    t = torch.full((numel,), float(rank + 1), device="cuda")
    staged = backend == "gloo"  # gloo's send/recv take host tensors
    dist.barrier()
    begun = time.perf_counter()
    if rank == 0:
        dist.send(t.cpu() if staged else t, dst=1)
    else:
        into = torch.empty(numel, dtype=t.dtype) if staged else t
        dist.recv(into, src=0)
        if staged:
            t.copy_(into)
        torch.cuda.synchronize()
        result.put({"backend": backend, "staged_through_host": staged, "mb": numel * 4 / 2**20,
                    "seconds": time.perf_counter() - begun, "received_ok": bool((t == 1.0).all().item())})
    dist.destroy_process_group()


def part_p2p(_: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    for backend in ("nccl", "gloo"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        result = ctx.Queue()
        procs = [ctx.Process(target=_p2p_rank, args=(r, port, backend, 64 << 20, result)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=45)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if all(p.exitcode == 0 for p in procs) and not result.empty():
            row = result.get()
            out[backend] = {**row, "mb_per_s": round(row["mb"] / row["seconds"], 1)}
        else:
            out[backend] = {"failed": [p.exitcode for p in procs],
                            "note": "NCCL refuses two ranks on one GPU: needs 2 GPUs" if backend == "nccl" else ""}
    if not any("received_ok" in row for row in out.values()):
        raise RuntimeError(f"no backend moved the tensor between two processes on one GPU: {out}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--device", default="h200", help="the cost model's device to compare with")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("dynarl bench gpu: no CUDA device here", file=sys.stderr)
        return 2
    parts: dict[str, Callable[[argparse.Namespace], dict]] = {
        "native": part_native, "device_lock": part_device_lock, "costmodel": part_costmodel,
        "megatron": part_megatron, "p2p": part_p2p}
    report: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    for name in args.parts.split(","):
        begun = time.perf_counter()
        try:
            report[name] = {"ok": True, **parts[name](args)}
        except Exception as exc:
            report[name] = {"ok": False, "error": f"{exc!r}", "trace": traceback.format_exc()[-2000:]}
        report[name]["seconds"] = round(time.perf_counter() - begun, 2)
        torch.cuda.empty_cache()
        print(f"{name}: {'ok' if report[name]['ok'] else 'FAILED ' + report[name]['error']} "
              f"({report[name]['seconds']} s)", file=sys.stderr, flush=True)
    text = json.dumps(report, indent=None if args.json else 2, default=str)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if all(report[n]["ok"] for n in args.parts.split(",")) else 1
