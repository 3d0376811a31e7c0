"""`dynarl bench async`: `dynarl train` with algorithm.max_staleness 0 and 1 side by
side, in the same spatial placement (one rollout, one inference, one trainer rank by
default), on the built-in task: step time, reward and staleness of each, and the
ratio of their step times. Both runs start from the same seed (same prompts, same
warm start); the first step is left out of the step time (both generate it in place)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time

import yaml

from dynarl.transport.errors import ConfigError


def run(staleness: int, steps: int, extra: list[str], root: str) -> dict:
    from dynarl.launch.train import prepare
    args = ["placement.mode=spatial", "runtime.cluster.devices_per_node=3", "rollout.num_ranks=1",
            "inference.num_ranks=1", "trainer.num_ranks=1", f"run.steps={steps}",
            f"algorithm.max_staleness={staleness}", *extra]
    run_dir = os.path.join(root, f"staleness{staleness}")
    log = os.path.join(root, f"staleness{staleness}.log")
    with open(log, "w") as out, contextlib.redirect_stdout(out):  # the job's progress lines: not the bench's output
        job = prepare(None, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)], run_dir, None)
        started = time.perf_counter()
        code = job.run()
        wall = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"the max_staleness={staleness} run failed: {open(log).read()[-2000:]}")
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rewards = [r["reward_mean"] for r in rows]
    k = min(10, len(rows) // 2)
    return {"steps": len(rows), "wall_s": round(wall, 2),
            "step_s_mean": round(sum(r["step_time_s"] for r in rows[1:]) / max(len(rows) - 1, 1), 4),
            "reward_first": round(sum(rewards[:k]) / k, 4), "reward_last": round(sum(rewards[-k:]) / k, 4),
            "staleness_max": max(r["staleness_max"] for r in rows),
            "staleness_mean": round(sum(r["staleness_mean"] for r in rows) / len(rows), 4)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench async", description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="GRPO steps per run (the main job's default)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("overrides", nargs="*", help="key.path=value for both runs")
    args = parser.parse_args(argv)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="dynarl-bench-async-") as root:
        for staleness in (0, 1):
            print(f"[bench async] max_staleness={staleness}: {args.steps} steps", file=sys.stderr, flush=True)
            try:
                out[f"staleness{staleness}"] = run(staleness, args.steps, args.overrides, root)
            except ConfigError as exc:
                print(f"dynarl bench async: error: {exc}", file=sys.stderr)
                return 2
    out["step_time_ratio"] = round(out["staleness0"]["step_s_mean"] / out["staleness1"]["step_s_mean"], 3)
    out["wall_ratio"] = round(out["staleness0"]["wall_s"] / out["staleness1"]["wall_s"], 3)
    print(json.dumps(out) if args.json else "\n".join(f"{k:<18} {v}" for k, v in out.items()))
    return 0
