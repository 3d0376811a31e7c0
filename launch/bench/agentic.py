"""`dynarl bench agentic`: multi-turn tool-using episodes on two native rollout
engines, FIFO against DynaRL's (tool_count, cached_prefix) priority with cache
affinity, side by side in one run.

Each episode alternates a generated turn, a tool call (the sandbox-free
calculator plus a sampled tool latency), and an observation appended to the
context; the next turn's prompt is the whole history. Engines have little KV
room, so a prefix can be evicted while its episode waits on a tool:
- `fifo`: every turn queues in arrival order and goes to the least loaded engine;
- `priority`: follow-up turns go first (core/priority.py, bounded overtaking),
  and back to the engine holding their prefix unless it is saturated (DataRouter).
Reported per mode: `requests_per_s` (turns completed / wall time),
`reprefill_tokens` (context tokens computed before that had to be prefilled
again), and `max_wait_s` (arrival to admission, seen at step granularity).

The workload is synthetic (seeded turn counts, lengths and latencies): the
built-in agentic training task is not built yet.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.engine import NativeEngineConfig, NativeRolloutEngine
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.components.tools.calculator import calculate
from dynarl.core.data_router import DataRouter, ItemStatus, WorkerState
from dynarl.core.priority import PriorityConfig


def episodes(seed: int, count: int, vocab: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": f"e{i}", "prompt": [rng.randrange(3, vocab) for _ in range(rng.randint(40, 64))],
             "turns": rng.randint(2, 4), "gen": [rng.randint(8, 24) for _ in range(4)],
             "latency": [rng.uniform(0.02, 0.15) for _ in range(4)], "seed": i} for i in range(count)]


async def run_mode(mode: str, model, eps: list[dict], args) -> dict:
    engines = []
    for _ in range(2):
        engine = NativeRolloutEngine(model, NativeEngineConfig(block_size=16, num_blocks=args.blocks, max_num_seqs=8))
        engine.set_queue_key(make_queue_key("priority" if mode == "priority" else "fifo",
                                            PriorityConfig(max_bonus_s=args.window_s)))
        engines.append(engine)
    router = DataRouter(saturation=0.9)
    loop = asyncio.get_running_loop()
    state = {e["id"]: {"context": list(e["prompt"]), "turn": 0, "status": ItemStatus(
        affinity="prefer" if mode == "priority" else "none")} for e in eps}
    arrival: dict[str, float] = {}
    waits: list[float] = []
    reprefill = 0
    turns_done = 0
    pending = len(eps)
    wake = [asyncio.Event(), asyncio.Event()]
    finished = asyncio.Event()

    def submit(ep: dict) -> None:
        s = state[ep["id"]]
        loads = {str(i): WorkerState(min(1.0, (e.load().num_running + e.load().num_waiting) / 8))
                 for i, e in enumerate(engines)}
        route = router.distribute(s["status"], loads)
        rid = f"{ep['id']}/t{s['turn']}"
        arrival[rid] = loop.time()
        engines[int(route.worker)].add_request(GenerationRequest(
            rid, list(s["context"]), SamplingParams(max_new_tokens=ep["gen"][s["turn"]], seed=ep["seed"] * 10 + s["turn"]),
            tool_count=s["turn"], arrival_time=arrival[rid]))
        wake[int(route.worker)].set()

    async def tool_then_continue(ep: dict, result) -> None:
        nonlocal reprefill, turns_done, pending
        s = state[ep["id"]]
        if s["turn"] > 0:  # context computed in earlier turns that the cache did not serve
            reprefill += max(0, s["prev_len"] - result.cached_tokens)
        s["context"] += result.output_token_ids
        s["status"].cached_prefix = len(s["context"])
        turns_done += 1
        s["turn"] += 1
        if s["turn"] >= ep["turns"]:
            pending -= 1
            if pending == 0:
                finished.set()
            return
        await asyncio.sleep(ep["latency"][s["turn"]])
        observation = calculate(f"{len(s['context'])} * 3 + {s['turn']}")
        s["prev_len"] = len(s["context"])
        s["context"] += [3 + (ord(c) % 90) for c in observation.stdout.strip()][:16] or [3]
        submit(ep)

    async def drive(i: int) -> None:
        engine = engines[i]
        by_id = {e["id"]: e for e in eps}
        while not finished.is_set():
            if not engine.has_work():
                wake[i].clear()
                await wake[i].wait()
                continue
            for result in await engine.step():
                ep = by_id[result.request_id.split("/")[0]]
                asyncio.ensure_future(tool_then_continue(ep, result))
            now = loop.time()
            for rid in engine.running_request_ids():
                if rid in arrival:
                    waits.append(now - arrival.pop(rid))
            await asyncio.sleep(0)

    for ep in eps:
        state[ep["id"]]["prev_len"] = len(ep["prompt"])
        submit(ep)
    started = time.perf_counter()
    drivers = [asyncio.ensure_future(drive(i)) for i in range(2)]
    await finished.wait()
    elapsed = time.perf_counter() - started
    for d in drivers:
        d.cancel()
    await asyncio.gather(*drivers, return_exceptions=True)
    return {"requests_per_s": turns_done / elapsed, "reprefill_tokens": reprefill,
            "max_wait_s": max(waits) if waits else 0.0, "turns": turns_done, "seconds": elapsed}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench agentic")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--blocks", type=int, default=96, help="KV blocks of 16 tokens per engine (cache pressure)")
    parser.add_argument("--window-s", type=float, default=5.0, help="priority's overtaking window")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"]).eval()
    eps = episodes(args.seed, args.episodes, model.config.vocab_size)
    import uvloop
    out: dict = {}
    for mode in ("fifo", "priority"):
        result = uvloop.run(run_mode(mode, model, eps, args))
        print(f"[bench agentic] {mode}: {result}", file=sys.stderr, flush=True)
        for key in ("requests_per_s", "reprefill_tokens", "max_wait_s"):
            out[f"{mode}_{key}"] = round(result[key], 3) if isinstance(result[key], float) else result[key]
    out["turns"] = result["turns"]
    out["priority_speedup"] = round(out["priority_requests_per_s"] / out["fifo_requests_per_s"], 3)
    print(json.dumps(out) if args.json else "\n".join(f"{k:<28} {v}" for k, v in out.items()))
    return 0
