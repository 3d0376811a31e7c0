"""How long is the rollout's tail, per engine? A headroom measurement for issue 6.

    python -m dynarl.launch.sim.engine_spread --workload math-7b --devices 64 [--seed S]

Takes the iteration `dynarl sim` measures (iteration 1 of the seed) and runs each
rollout engine alone, in virtual time, on the prompt groups it would hold:

- `dealt`: groups dealt round robin, as colocated's engines draw them from the
  prompt channel. `makespan_s` is the colocated rollout; `busy_frac` is the
  engines' mean busy time over it: the share of the rollout's device-time that is
  not idle tail, i.e. what no reallocation can take from the rollout without
  packing its requests denser.
- `oracle_*`: an oracle that knows every length puts the groups with the longest
  sample on "express" engines, spread thin, and packs the rest on the others; the
  best of a few splits shows what knowing the lengths could save on the rollout.

Engines do not interact here (no migrations), which is exact for colocated.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dynarl.components.rollout.base import GenerationRequest, SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.workloads.catalog import get_workload, prompts_for
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.samples import Group
from dynarl.core.virtual_time import run_virtual

ORACLE_SPLITS = tuple((groups, eighths) for groups in (1, 2, 3, 4, 6) for eighths in (1, 2, 4, 6))
"""(express groups per express engine, express engines per 8 engines): the oracle's best of these."""


def engine_makespans(groups: list[Group], assignment: list[int], engines: int, model: str, tp: int) -> list[float]:
    """Seconds each engine takes to generate the groups assigned to it, alone."""
    async def one(mine: list[Group]) -> float:
        engine = EmulatedRolloutEngine(EmulatedRolloutConfig(model=model, tp=tp, enable_prefix_cache=False,
                                                             lazy_outputs=True))
        requests = [GenerationRequest(s.sample_id, list(range(g.prompt_tokens)),
                                      SamplingParams(max_new_tokens=s.response_tokens))
                    for g in mine for s in g.samples]
        loop = asyncio.get_running_loop()
        start = loop.time()
        if requests:
            await engine.generate(requests)
        return loop.time() - start
    return [run_virtual(one([g for g, e in zip(groups, assignment) if e == k])) for k in range(engines)]


def oracle_assignment(groups: list[Group], engines: int, per_express: int, express: int) -> list[int]:
    """The longest groups (by their longest sample), `per_express` to each of `express`
    engines; the rest dealt round robin over the other engines."""
    order = sorted(range(len(groups)), key=lambda i: (-max(s.response_tokens for s in groups[i].samples), i))
    assignment = [0] * len(groups)
    for k, i in enumerate(order):
        if k < per_express * express:
            assignment[i] = k % express
        else:
            assignment[i] = express + (k - per_express * express) % (engines - express)
    return assignment


def spread(groups: list[Group], engines: int, model: str, tp: int) -> dict:
    """The dealt engines' makespans and the best oracle split's (see the module doc)."""
    dealt = engine_makespans(groups, [i % engines for i in range(len(groups))], engines, model, tp)
    best = None
    for per_express, per_eight in ORACLE_SPLITS:
        express = max(1, engines * per_eight // 8)
        if express >= engines or per_express * express > len(groups):
            continue
        spans = engine_makespans(groups, oracle_assignment(groups, engines, per_express, express), engines, model, tp)
        if best is None or max(spans) < best[0]:
            best = (max(spans), per_express, express)
    return {"dealt": {"makespan_s": round(max(dealt), 1), "mean_engine_s": round(sum(dealt) / engines, 1),
                      "first_engine_done_s": round(min(dealt), 1),
                      "busy_frac": round(sum(dealt) / engines / max(dealt), 3)},
            "oracle_makespan_s": round(best[0], 1) if best else None,
            "oracle_split": {"groups_per_express_engine": best[1], "express_engines": best[2]} if best else None}


def measure(workload_name: str, devices: int, seed: int) -> dict:
    workload = get_workload(workload_name)
    if workload.kind != "math":
        raise ValueError("engine_spread measures single-turn (math) workloads")
    tp = workload.rollout_tp
    if devices % tp or devices < tp:
        raise ValueError(f"{workload_name} runs rollout at TP {tp}: devices must be a multiple of {tp}")
    groups = generate(workload, seed, 1, prompts_for(workload, devices))
    return {"workload": workload_name, "devices": devices, "engines": devices // tp, "seed": seed,
            **spread(groups, devices // tp, workload.model, tp)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dynarl.launch.sim.engine_spread", description=__doc__.split("\n")[0])
    p.add_argument("--workload", default="math-7b")
    p.add_argument("--devices", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        print(json.dumps(measure(args.workload, args.devices, args.seed), sort_keys=True))
    except ValueError as exc:
        print(f"engine_spread: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
