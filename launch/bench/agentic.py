"""`dynarl bench agentic`: the built-in agentic task (calc) on two native rollout
engines, FIFO against DynaRL's (tool_count, cached_prefix) priority with cache
affinity, side by side in one run.

The tiny model is first warm-started in process on the task's demonstrations
(the batches `dynarl train` builds, here all with the tool), so it really calls
the calculator: turn 1 writes "[calc 347*29]", the calculator answers, turn 2
writes the answer.
Episodes run through the training workflow's own EpisodeDriver (routing, tool
calls, observations, re-prefill accounting); only the transport differs: the
engines live in this process instead of behind channels. Each tool call also
waits a seeded latency (--tool-ms, uniform in [lo, hi]) standing in for a real
tool's round trip: the calculator itself answers in microseconds, and without a
wait no episode would ever be queued behind another's follow-up.

Modes:
- `fifo`: every turn queues in arrival order and goes to the least loaded engine;
- `priority`: follow-up turns go first (core/priority.py, bounded overtaking),
  and back to the engine holding their prefix unless it is saturated (DataRouter).
Reported per mode, medians over --repeats runs: `requests_per_s` (turns
completed / wall time), `reprefill_tokens` (context an engine had computed that
the serving engine had to prefill again), the episodes' reward (the same seeded
tokens in both modes, so equal); and `max_wait_s` (arrival to admission, at
step granularity), the worst of all runs. Runs alternate modes, as machine load
drifts: on a shared 2-core machine requests_per_s varies 2x between runs.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import statistics
import sys
import time

import torch

from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.io import load_weights
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.spec import safe_decode
from dynarl.components.model.tokenizer import CharTokenizer
from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine
from dynarl.components.rollout.queue_keys import make_queue_key
from dynarl.components.rollout.turn import TurnRequest
from dynarl.components.tasks.source import ProblemSource, TaskConfig
from dynarl.components.tools.calculator import calculate
from dynarl.components.tools.outcome import ToolResult
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.workflows.agentic import demonstration_batch, episode_reward
from dynarl.components.workflows.agentic_rollout import TurnWaits, turn_result
from dynarl.components.workflows.episodes import Episode, EpisodeDriver, Limits, ReactTurns
from dynarl.core.priority import PriorityConfig

RANKS = 2


def warm_model(steps: int, batch_size: int, seed: int, direct_frac: float = 0.0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])
    trainer = NativeTrainer(model, TrainerConfig(lr=1e-3, micro_batch_size=batch_size, grad_clip=1.0))
    source, tok = ProblemSource(TaskConfig(kind="calc"), seed), CharTokenizer()
    for i in range(steps):
        trainer.train_step(demonstration_batch(source.warmup_problems(i * batch_size, batch_size), tok, 24,
                                               direct_frac, seed))
    trained = Qwen2ForCausalLM(TINY_CONFIGS["tiny-0.5m"])  # (the trainer's own model is FSDP-sharded)
    load_weights(trained, [pair for bucket in trainer.named_weights(1 << 40) for pair in bucket], strict=True)
    return trained.eval()


async def run_mode(mode: str, model, args) -> dict:
    tok = CharTokenizer()
    loop = asyncio.get_running_loop()
    engines = []
    for _ in range(RANKS):
        engine = NativeRolloutEngine(model, NativeEngineConfig(block_size=args.block_size, num_blocks=args.blocks,
                                                               max_num_seqs=args.max_num_seqs))
        engine.set_queue_key(make_queue_key(mode, PriorityConfig(max_bonus_s=args.window_s)))
        engines.append(engine)
    wake = [asyncio.Event() for _ in engines]
    results: asyncio.Queue = asyncio.Queue()
    waits = [TurnWaits() for _ in range(RANKS)]
    sampling = {"temperature": 1.0, "stop_token_ids": (tok.eos_id, tok.encode("]")[0])}
    rng = random.Random(args.seed)
    lo, hi = args.tool_ms

    async def submit(rank: int, turn: TurnRequest) -> None:
        now = loop.time()
        engines[rank].add_request(GenerationRequest(
            turn.id, turn.prompt_ids, SamplingParams(**sampling, max_new_tokens=turn.max_new_tokens,
                                                     seed=turn.seed),
            tool_count=turn.tool_count, arrival_time=now))
        waits[rank].arrived(turn.id, now)
        wake[rank].set()

    async def call_tool(tool: str, argument: str) -> ToolResult:
        await asyncio.sleep(rng.uniform(lo, hi) / 1000)
        return calculate(argument)

    async def drive(rank: int) -> None:
        engine = engines[rank]
        while True:
            if not engine.has_work():
                wake[rank].clear()
                await wake[rank].wait()
                continue
            done = await engine.step()
            now = loop.time()
            waits[rank].after_step(engine, now)
            for r in done:
                await results.put(turn_result(r, waits[rank].finished(r.request_id, now)))
            await asyncio.sleep(0)

    limits = Limits(max_turns=3, max_new_tokens=20, max_context=model.config.max_position_embeddings)
    turns = ReactTurns(tok, limits, call_tool, decode=functools.partial(safe_decode, tok))
    driver = EpisodeDriver(turns, range(RANKS), submit, affinity="prefer" if mode == "priority" else "none",
                           capacity=args.capacity)
    source = ProblemSource(TaskConfig(kind="calc"), args.seed)
    problems = source.problems(0, args.episodes)
    episodes = [Episode(p.id, tok.encode(p.prompt, add_bos=True), seed=i) for i, p in enumerate(problems)]
    drivers = [asyncio.ensure_future(drive(r)) for r in range(RANKS)]
    started = time.perf_counter()
    try:
        await driver.run(episodes, results.get)
    finally:
        for d in drivers:
            d.cancel()
        await asyncio.gather(*drivers, return_exceptions=True)
    elapsed = time.perf_counter() - started
    answers = {p.id: p.answer for p in problems}
    rewards = [episode_reward(e, answers[e.id]) for e in episodes]
    return {"requests_per_s": driver.turns / elapsed, "reprefill_tokens": driver.reprefill_tokens,
            "max_wait_s": driver.max_wait_s, "turns": driver.turns, "seconds": elapsed,
            "tool_calls": sum(e.tool_calls for e in episodes), "reward_mean": sum(rewards) / len(rewards),
            "routes": dict(driver.router.by_reason)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench agentic")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--episodes", type=int, default=192)
    parser.add_argument("--warmup-steps", type=int, default=150, help="supervised steps teaching the tool format")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="running turns per engine (queueing)")
    parser.add_argument("--blocks", type=int, default=512, help="KV blocks per engine (prefix-cache pressure)")
    parser.add_argument("--block-size", type=int, default=4)
    parser.add_argument("--capacity", type=int, default=256, help="outstanding turns at which an engine is full")
    parser.add_argument("--window-s", type=float, default=5.0, help="priority's overtaking window")
    parser.add_argument("--tool-ms", type=float, nargs=2, default=(20.0, 100.0), metavar=("LO", "HI"))
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (medians reported)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    begun = time.perf_counter()
    model = warm_model(args.warmup_steps, 64, args.seed)
    warm_s = time.perf_counter() - begun
    import uvloop
    runs: dict[str, list[dict]] = {"fifo": [], "priority": []}
    for r in range(args.repeats):  # alternate the order: machine-load drift hits both modes alike
        for mode in (("fifo", "priority") if r % 2 == 0 else ("priority", "fifo")):
            result = uvloop.run(run_mode(mode, model, args))
            print(f"[bench agentic] {mode} run {r}: {result}", file=sys.stderr, flush=True)
            runs[mode].append(result)
    out: dict = {}
    for mode, results in runs.items():
        # medians over the repeats; max_wait_s is the worst wait seen in any of them
        for key in ("requests_per_s", "reprefill_tokens", "reward_mean", "tool_calls", "turns"):
            value = statistics.median(x[key] for x in results)
            out[f"{mode}_{key}"] = round(value, 3) if isinstance(value, float) else value
        out[f"{mode}_max_wait_s"] = round(max(x["max_wait_s"] for x in results), 3)
        out[f"{mode}_requests_per_s_runs"] = [round(x["requests_per_s"], 1) for x in results]
    out["priority_speedup"] = round(out["priority_requests_per_s"] / out["fifo_requests_per_s"], 3)
    out["episodes"], out["warmup_s"] = args.episodes, round(warm_s, 1)
    out["tool_ms"] = list(args.tool_ms)
    print(json.dumps(out) if args.json else "\n".join(f"{k:<28} {v}" for k, v in out.items()))
    return 0
