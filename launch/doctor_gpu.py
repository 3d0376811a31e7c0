"""The parts of `dynarl doctor --gpu` that only a CUDA GPU can answer (launch/doctor.py
runs each in a process of its own). Written against torch's and megatron-core's CUDA
APIs; none has run yet where no GPU was lent (README, "What is verified where").

    device_lock     the rollout engine's release_memory/resume_memory and the trainer's
                    offload/onload: device memory in use before, released and back
    costmodel       prefill and decode-step times of the native engine at the Qwen2.5-0.5B
                    and -1.5B shapes beside components/costmodel.py's prediction (h100-80gb)
    megatron_state  megatron's own optimizer: a step, offload/onload memory, its state
                    exported and imported again (what a P2P reshard moves) unchanged
    megatron_1p5b   a megatron trainer at the Qwen2.5-1.5B shape: step time, MFU, peak
                    memory beside the memory plan's
    memory_release  memory a process frees is allocatable by the next process
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import torch

COSTMODEL_DEVICE = "h100-80gb"
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
    from dynarl.components.rollout.native.config import NativeEngineConfig
    from dynarl.components.rollout.native.engine import NativeRolloutEngine

    blocks = num_seqs * (-(-tokens_each // 16)) + 8
    return NativeRolloutEngine(model, NativeEngineConfig(num_blocks=blocks, max_num_seqs=num_seqs,
                                                         max_prefill_tokens=max(4096, tokens_each),
                                                         enable_prefix_cache=False))


def _batch(vocab: int, rows: int = 8, length: int = 64) -> Any:
    from dynarl.components.trainer.base import TrainBatch

    g = torch.Generator().manual_seed(1)
    return TrainBatch(input_ids=[torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(rows)],
                      prompt_lens=[length // 2] * rows, advantages=[1.0 if i % 2 else -1.0 for i in range(rows)])


def part_device_lock(gpu: bool) -> dict:
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


def part_costmodel(gpu: bool) -> dict:
    from dynarl.components import costmodel

    device = costmodel.get_device(COSTMODEL_DEVICE)
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


def part_megatron_state(gpu: bool) -> dict:
    from dynarl.components.trainer.world import init_default_group
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
        out["loss"] = trainer.train_step(_batch(config.vocab_size)).loss
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


def part_megatron_1p5b(gpu: bool) -> dict:
    import torch

    from dynarl.components import costmodel
    from dynarl.components.trainer.world import init_default_group
    from dynarl.components.model.config import ModelConfig
    from dynarl.components.trainer.base import TrainBatch, TrainerConfig
    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer

    init_default_group(None)
    config = ModelConfig(max_position_embeddings=4096, **SHAPES["qwen2.5-1.5b"])
    micro, rows, length = 4, 16, 1024
    trainer = MegatronTrainer(config, TrainerConfig(micro_batch_size=micro), MegatronConfig())
    g = torch.Generator().manual_seed(1)
    batch = TrainBatch(input_ids=[torch.randint(3, config.vocab_size, (length,), generator=g).tolist()
                                  for _ in range(rows)], prompt_lens=[length // 2] * rows,
                       advantages=[1.0 if i % 2 else -1.0 for i in range(rows)])
    try:
        trainer.train_step(batch)  # warm-up
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        begun = time.perf_counter()
        trainer.train_step(batch)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - begun
        peak = torch.cuda.max_memory_allocated()
    finally:
        trainer.close()
    params = config.num_parameters
    flops = 6 * params * rows * length  # forward and backward, dense layers (attention not counted)
    device = costmodel.get_device("h100-80gb")
    out = {"params": params, "tokens": rows * length, "step_s": round(seconds, 3),
           "mfu": round(flops / seconds / device.bf16_flops, 4), "peak_gb": round(peak / 1e9, 3)}
    plan = planned_trainer_bytes(config, micro, length)
    if plan is not None:
        out["planned_gb"] = round(plan / 1e9, 3)
        out["peak_over_plan"] = round(peak / plan, 3)
    return out


def planned_trainer_bytes(config: Any, micro_batch: int, seq_len: int) -> int:
    """The memory plan's train-phase bytes of this one megatron rank (components/memory/),
    from a `dynarl train` config of the same shape on one GPU."""
    import json
    import tempfile

    from dynarl.components.memory.of_config import plan_of
    from dynarl.launch.train import resolve_config

    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/config.json", "w") as f:
            json.dump(config.to_hf_dict(), f)
        new_tokens = 64
        cfg = resolve_config(None, [
            ("model.path", folder), ("runtime.cluster.device_kind", "cuda"), ("runtime.cluster.devices_per_node", 1),
            ("placement.mode", "colocated"), ("rollout.num_ranks", 1), ("inference.num_ranks", 1),
            ("trainer.num_ranks", 1), ("trainer.backend", "megatron"), ("trainer.engine.micro_batch_size", micro_batch),
            ("rollout.max_new_tokens", new_tokens), ("memory.prompt_tokens", seq_len - new_tokens)], None)
        plan = plan_of(cfg)
    return sum(plan.devices[0].phases["train"]["trainer.0"].values())


def _hold_and_free(gb: float, hold: Any, freed: Any, queue: Any) -> None:
    """Allocates `gb`, signals `hold`, waits for `freed`, then drops it and gives the
    cached blocks back (release_cached_memory) and reports; stays alive meanwhile."""
    import torch

    from dynarl.components.device_memory import release_cached_memory

    t = torch.empty(int(gb * 1e9), dtype=torch.uint8, device="cuda")
    hold.set()
    freed.wait(20)
    del t
    release_cached_memory()
    queue.put(round(torch.cuda.mem_get_info()[0] / 1e9, 3))
    freed.wait(20)  # alive (its CUDA context too) until the second process has allocated


def _allocate(gb: float, queue: Any) -> None:
    import torch

    torch.empty(int(gb * 1e9), dtype=torch.uint8, device="cuda")
    queue.put(True)


def part_memory_release(gpu: bool) -> dict:
    """More than half the GPU held by a first process, released while it stays alive,
    then allocated by a second: it fits only if the first gave the memory back."""
    import multiprocessing as mp

    total = torch.cuda.mem_get_info()[1]
    gb = round(total * 0.55 / 1e9, 1)
    ctx = mp.get_context("spawn")
    hold, freed, report, got = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    first = ctx.Process(target=_hold_and_free, args=(gb, hold, freed, report))
    first.start()
    try:
        if not hold.wait(30):
            raise RuntimeError(f"the first process could not allocate {gb} GB")
        freed.set()
        free_after = report.get(timeout=20)
        second = ctx.Process(target=_allocate, args=(gb, got))
        second.start()
        second.join(30)
        if second.exitcode != 0:
            raise RuntimeError(f"the second process could not allocate {gb} GB after the first released it "
                               f"(exit {second.exitcode}; {free_after} GB free)")
    finally:
        first.join(25)
        if first.is_alive():
            first.kill()
    return {"total_gb": round(total / 1e9, 3), "each_gb": gb, "free_after_release_gb": free_after,
            "second_allocated": got.get(timeout=5)}
