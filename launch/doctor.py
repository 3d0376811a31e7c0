"""`dynarl doctor`: the production path run on this machine's devices, one report.

Without --gpu it runs on logical CPU devices (CI runs it as a test); with --gpu the
same parts run on one CUDA GPU, plus the parts only a GPU can answer. Every part runs
in a process of its own under its own timeout, so a crash or a hang in one (a CUDA
error, an NCCL refusal) is reported and the others still run:

    train           `dynarl train` on one device (colocated placement: trainer, rollout
                    and inference share it), tiny model, 2 GRPO steps: the weight sync
                    each step is a local hand-off (a CUDA IPC handle on a GPU); its
                    bytes, time and GB/s
    train_megatron  the same with trainer.backend=megatron (needs dynarl[megatron])
    p2p_move        a trainer moved peer-to-peer between two layouts on the one device
                    (create before destroy: old and new ranks share it), its state
                    confirmed equal after the move
    decode          the native rollout engine's decode tokens/s (a Qwen2.5-0.5B shape
                    on a GPU, the tiny model on a CPU)
    and with --gpu, launch/doctor_gpu.py's: device_lock, costmodel, megatron_state,
    megatron_1p5b (step time, MFU, peak memory against the memory plan), memory_release

    dynarl doctor [--gpu] [--parts a,b] [--json] [--out FILE] [--wheels]

--wheels prints the pip command for the packages the GPU run needs that a stock CUDA
torch image lacks (they fit in 64 MiB; SGLang and vLLM do not and are not part of it).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

PARTS = ("train", "train_megatron", "p2p_move", "decode", "device_lock", "costmodel", "megatron_state",
         "megatron_1p5b", "memory_release")
GPU_ONLY = ("device_lock", "costmodel", "megatron_state", "megatron_1p5b", "memory_release")
TIMEOUT_S = {"train": 90, "train_megatron": 120, "p2p_move": 45, "decode": 25, "device_lock": 25,
             "costmodel": 50, "megatron_state": 30, "megatron_1p5b": 60, "memory_release": 25}
"""Each part's own limit (a part past it is killed, with every process it started);
together 470 s: `dynarl doctor --gpu` ends within 8 minutes whatever hangs."""
WHEELS = ["pyzmq", "msgpack", "uvloop", "pyyaml", "rich", "safetensors", "cryptography", "matplotlib",
          "math-verify", "pyarrow", "megatron-core==0.16.1", "psutil"]
"""dynarl's requirements beyond torch and numpy (in every CUDA torch image), and megatron's extra."""

TINY_JOB = ["runtime.cluster.devices_per_node=1", "placement.mode=colocated",
            "rollout.num_ranks=1", "inference.num_ranks=1", "trainer.num_ranks=1",
            "task.count_up.alphabet=abcdefghij", "task.count_up.median_len=2",
            "rollout.max_new_tokens=12", "rollout.samples_per_prompt=4", "rollout.chunk_size=2",
            "run.prompts_per_step=8", "trainer.warmup.steps=4", "trainer.warmup.batch_size=32",
            "trainer.engine.micro_batch_size=32", "run.steps=2"]
"""A job of seconds that runs every stage of a GRPO step on one device."""


def kind(gpu: bool) -> str:
    return "cuda" if gpu else "cpu"


def megatron_args(gpu: bool) -> list[str]:
    """On a GPU megatron's own distributed optimizer in bf16; on a CPU (the tests' shims)
    the settings megatron runs there: dynarl's AdamW, float32, CPU initialisation."""
    if gpu:
        return ["trainer.backend=megatron"]
    return ["trainer.backend=megatron", "trainer.megatron={optimizer: adamw, dtype: float32, "
            "use_distributed_optimizer: false, use_cpu_initialization: true}"]


# --- the parts (each runs in its own process) ---------------------------------------------

def _train(gpu: bool, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="dynarl-doctor-") as run_dir:
        argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY_JOB,
                f"runtime.cluster.device_kind={kind(gpu)}", *extra, "--run-dir", run_dir]
        proc = subprocess.run(argv, capture_output=True, text=True)  # (the part's own timeout bounds it)
        if proc.returncode != 0:
            raise RuntimeError(f"dynarl train failed (rc {proc.returncode}): {proc.stderr[-1500:]}")
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    if len(rows) != 2:
        raise RuntimeError(f"dynarl train wrote {len(rows)} steps, not 2")
    sync_bytes = [r["sync_bytes"] for r in rows]
    if min(sync_bytes) <= 0:
        raise RuntimeError(f"a weight sync sent nothing: {sync_bytes}")
    sync_s = [r["sync_s"] for r in rows]
    return {"steps": len(rows), "step_time_s": [round(r["step_time_s"], 3) for r in rows],
            "reward_mean": [r["reward_mean"] for r in rows], "sync_bytes": sync_bytes,
            "sync_s": [round(s, 4) for s in sync_s],
            "sync_gb_per_s": round(sum(sync_bytes) / sum(sync_s) / 1e9, 4) if sum(sync_s) > 0 else None}


def part_train(gpu: bool) -> dict:
    return _train(gpu, [])


def part_train_megatron(gpu: bool) -> dict:
    from dynarl.components.extras import is_available

    if not is_available("megatron"):
        raise RuntimeError("megatron-core is not installed: pip install 'dynarl[megatron]'")
    return _train(gpu, megatron_args(gpu))


def part_p2p_move(gpu: bool) -> dict:
    return asyncio.run(_p2p_move(gpu))


async def _p2p_move(gpu: bool) -> dict:
    import dynarl
    from dynarl.components.model.spec import ModelSpec
    from dynarl.components.trainer.base import TrainBatch, TrainerConfig
    from dynarl.components.trainer.worker import TrainerWorker
    from dynarl.core.migration.p2p import p2p_migrate

    config = dynarl.RuntimeConfig(launcher="local", cluster=dynarl.ClusterConfig(devices_per_node=1,
                                                                                 device_kind=kind(gpu)))
    init = {"model": ModelSpec(), "engine": TrainerConfig(micro_batch_size=8), "warmup_lr": 1e-3,
            "bucket_bytes": 1 << 20}
    batch = TrainBatch(input_ids=[[1, 5, 6, 7, 8, 2]] * 8, prompt_lens=[2] * 8,
                       advantages=[1.0, -1.0] * 4).to_wire()
    async with dynarl.Controller(config) as ctl:
        old = await ctl.spawn(TrainerWorker, name="trainer", devices=[0], init=init)
        await old.call(TrainerWorker.start, None)
        await old.call(TrainerWorker.train, batch)
        before = (await old.call(TrainerWorker.state_digest))[0]
        begun = time.perf_counter()
        moved = await p2p_migrate(ctl, old, [0], init)  # the new rank on the old one's device
        seconds = time.perf_counter() - begun
        after = (await moved.group.call(TrainerWorker.state_digest))[0]
        if before.sums != after.sums or before.step != after.step:
            raise RuntimeError(f"the state changed in the move: {before} -> {after}")
        await moved.group.call(TrainerWorker.train, batch)  # and it trains on
    return {"elements_moved": moved.elements_moved, "seconds": round(seconds, 3),
            "phases_s": {k: round(v, 3) for k, v in moved.phases.items()}, "state_equal": True}


def part_decode(gpu: bool) -> dict:
    import torch

    from dynarl.components.model.config import TINY_CONFIGS, ModelConfig
    from dynarl.components.model.qwen2 import Qwen2ForCausalLM
    from dynarl.components.rollout.base import GenerationRequest, SamplingParams
    from dynarl.components.rollout.native.config import NativeEngineConfig
    from dynarl.components.rollout.native.engine import NativeRolloutEngine

    torch.manual_seed(0)
    if gpu:
        from dynarl.launch.doctor_gpu import SHAPES

        config, dtype, batch, new = ModelConfig(max_position_embeddings=4096, **SHAPES["qwen2.5-0.5b"]), \
            torch.bfloat16, 64, 128
    else:
        config, dtype, batch, new = TINY_CONFIGS["tiny-0.5m"], torch.float32, 16, 32
    device = kind(gpu)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    engine = NativeRolloutEngine(model, NativeEngineConfig(num_blocks=batch * (-(-(32 + new) // 16)) + 8,
                                                           max_num_seqs=batch, enable_prefix_cache=False))
    g = torch.Generator().manual_seed(0)
    requests = [GenerationRequest(f"r{i}", torch.randint(3, config.vocab_size, (32,), generator=g).tolist(),
                                  SamplingParams(max_new_tokens=new, seed=i)) for i in range(batch)]
    asyncio.run(engine.generate(requests[:2]))  # warm-up
    begun = time.perf_counter()
    results = asyncio.run(engine.generate(requests))
    seconds = time.perf_counter() - begun
    tokens = sum(len(r.output_token_ids) for r in results)
    return {"model_params": sum(p.numel() for p in model.parameters()), "batch": batch, "tokens": tokens,
            "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}


def parts() -> dict[str, Callable[[bool], dict]]:
    from dynarl.launch import doctor_gpu as gpu

    return {"train": part_train, "train_megatron": part_train_megatron, "p2p_move": part_p2p_move,
            "decode": part_decode, "device_lock": gpu.part_device_lock, "costmodel": gpu.part_costmodel,
            "megatron_state": gpu.part_megatron_state, "megatron_1p5b": gpu.part_megatron_1p5b,
            "memory_release": gpu.part_memory_release}


# --- the report ---------------------------------------------------------------------------

def run_part(name: str, gpu: bool) -> dict:
    """One part in a process group of its own, under its timeout (past it the whole
    group is killed: `dynarl train`'s workers too, so none keeps the GPU): {"ok": ...}."""
    begun = time.perf_counter()
    argv = [sys.executable, "-m", "dynarl.launch.doctor", "--run-part", name] + (["--gpu"] if gpu else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S[name])
        lines = [line for line in out.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"ok": False, "error": f"exit {proc.returncode}: {err[-1500:]}"}
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        row = {"ok": False, "error": f"timed out after {TIMEOUT_S[name]} s"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything the part left behind
    row["seconds"] = round(time.perf_counter() - begun, 2)
    return row


def _run_here(name: str, gpu: bool) -> int:
    import traceback
    try:
        row = {"ok": True, **parts()[name](gpu)}
    except Exception as exc:  # noqa: BLE001 - the report carries it
        row = {"ok": False, "error": repr(exc)[-1500:], "trace": traceback.format_exc()[-2000:]}
    print(json.dumps(row, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dynarl doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="run on one CUDA GPU (and its GPU-only parts)")
    parser.add_argument("--parts", help="comma-separated, of: " + ", ".join(PARTS))
    parser.add_argument("--json", action="store_true", help="one line of JSON")
    parser.add_argument("--out", help="also write the report here")
    parser.add_argument("--wheels", action="store_true", help="print the pip command for the GPU run's packages")
    parser.add_argument("--run-part", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.wheels:
        print("pip download --only-binary=:all: --no-deps -d wheels " + " ".join(WHEELS))
        return 0
    if args.run_part:
        return _run_here(args.run_part, args.gpu)
    names = args.parts.split(",") if args.parts else [p for p in PARTS if args.gpu or p not in GPU_ONLY]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"dynarl doctor: unknown part(s) {unknown}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if args.gpu:
        import torch
        if not torch.cuda.is_available():
            print("dynarl doctor --gpu: no CUDA device here (torch.cuda.is_available() is False)", file=sys.stderr)
            return 2
    elif any(n in GPU_ONLY for n in names):
        print(f"dynarl doctor: {', '.join(n for n in names if n in GPU_ONLY)} need --gpu", file=sys.stderr)
        return 2
    report: dict[str, Any] = {"device": kind(args.gpu)}
    begun = time.perf_counter()
    for name in names:
        report[name] = run_part(name, args.gpu)
        row = report[name]
        print(f"{name}: {'ok' if row['ok'] else 'FAILED ' + row['error'][:300]} ({row['seconds']} s)",
              file=sys.stderr, flush=True)
    report["seconds"] = round(time.perf_counter() - begun, 2)
    text = json.dumps(report, indent=None if args.json else 2, default=str)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if all(report[n]["ok"] for n in names) else 1


if __name__ == "__main__":
    sys.exit(main())
