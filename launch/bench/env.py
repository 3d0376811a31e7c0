"""`dynarl bench env`: what one env step of a simulator costs on this machine, the
figure `dynarl sim --workload embodied` takes its env workers' step time from
(components/workloads/catalog.py).

One env, stepped with a fixed action for `--steps` steps (reset when an episode
ends, the reset counted in), twice: state observations only, and state plus an RGB
frame of `--size` pixels square rendered offscreen (MuJoCo's EGL renderer by default:
MUJOCO_GL=egl; no display is needed). Median of `--repeats` runs, microseconds per
step. The RGB figure is the one a vision policy's env (RLinf's ManiSkill runs feed a
VLA 224x224 frames) pays; on a GPU simulator rendering is faster, here it is a CPU's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def step_cost(env_id: str, steps: int, size: int | None) -> float:
    """Seconds per step of one env (`size`: render an RGB frame of size x size each step)."""
    import gymnasium as gym

    from dynarl.components.embodied.spaces import make_env
    env = make_env(env_id) if size is None else gym.make(env_id, render_mode="rgb_array", width=size, height=size)
    try:
        env.reset(seed=0)
        action = env.action_space.sample()
        for _ in range(10):  # the first steps build caches (and the renderer's context)
            _step(env, action, size)
        begun = time.perf_counter()
        for _ in range(steps):
            _step(env, action, size)
        return (time.perf_counter() - begun) / steps
    finally:
        env.close()


def _step(env, action, size: int | None) -> None:
    _, _, terminated, truncated, _ = env.step(action)
    if size is not None:
        env.render()
    if terminated or truncated:
        env.reset()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="dynarl bench env", description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Reacher-v5", help="a gymnasium env id (default Reacher-v5)")
    parser.add_argument("--steps", type=int, default=2000, help="steps per run, state only (RGB: a tenth)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--size", type=int, default=224, help="RGB frame side in pixels (RLinf's VLAs: 224)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.steps < 10 or args.repeats < 1 or args.size < 1:
        print("dynarl bench env: --steps >= 10, --repeats and --size >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("MUJOCO_GL", "egl")
    try:
        state = [step_cost(args.env, args.steps, None) for _ in range(args.repeats)]
        rgb = [step_cost(args.env, max(10, args.steps // 10), args.size) for _ in range(args.repeats)]
    except Exception as exc:  # no such env, the simulator's extra missing, no offscreen renderer
        print(f"dynarl bench env: {args.env}: {exc}", file=sys.stderr)
        return 2
    out = {"env": args.env, "size": args.size, "repeats": args.repeats, "mujoco_gl": os.environ["MUJOCO_GL"],
           "state_us": round(statistics.median(state) * 1e6, 1),
           "rgb_us": round(statistics.median(rgb) * 1e6, 1)}
    out["rgb_over_state"] = round(out["rgb_us"] / out["state_us"], 1)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.env}: {out['state_us']} us per step (state), {out['rgb_us']} us with a {args.size}x{args.size} "
              f"RGB frame ({out['mujoco_gl']}), x{out['rgb_over_state']}")
    return 0
