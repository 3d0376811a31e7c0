"""`dynarl sim --sweep`: dynarl's sensitivity to U_low and T (the donor window) on
math-1.5b (or --workload), one parameter varied at a time around the defaults (DynaRL §7.5, Fig 15:
U_low in {0.01, 0.1, 0.2, 0.3, 0.5}, T in {2, 4, 8, 32, 64} s). Every row runs the
same batches (one scenario); tokens/s is relative to the best row of its parameter.
"""
from __future__ import annotations

import sys
import time
from dataclasses import replace
from typing import Any

from dynarl.components.placement.dynarl import DEFAULT_CONFIG, Dynarl

from dynarl.launch.sim.metrics import policy_metrics
from dynarl.launch.sim.parallel import default_jobs, run_all
from dynarl.launch.sim.scenario import SimConfig, build_scenario

U_LOW = (0.01, 0.1, 0.2, 0.3, 0.5)
WINDOW_S = (2.0, 4.0, 8.0, 32.0, 64.0)
WORKLOAD = "math-1.5b"


def sweep(devices: int, seed: int, iterations: int, warmup: int, prompts: int | None,
          log: Any = None, workload: str = WORKLOAD, jobs: int = 1) -> dict[str, Any]:
    """Every row is its own run of dynarl on one scenario, `jobs` at a time (parallel.py)."""
    from dynarl.launch.sim.runner import run_policy
    scn = build_scenario(SimConfig(workload=workload, devices=devices, policies=("dynarl",), seed=seed,
                                   iterations=iterations, warmup=warmup, prompts=prompts))
    cells = [(param, v) for param, values in (("u_low", U_LOW), ("window_s", WINDOW_S)) for v in values]

    def task(param: str, v: float):
        def run() -> dict[str, Any]:
            started = time.perf_counter()
            config = replace(DEFAULT_CONFIG, **{param: v})
            m = policy_metrics(run_policy(scn, "dynarl", policy=Dynarl(config)), scn, timings=False)
            return {"row": {param: v, "tokens_per_s": m["tokens_per_s"], "iter_time_s": m["iter_time_s"],
                            "migrations": sum(k["count"] for k in m["migrations"].values())},
                    "wall_s": time.perf_counter() - started}
        return run

    def done(i: int, out: dict[str, Any]) -> None:
        if log is not None:
            param, v = cells[i]
            print(f"dynarl sim --sweep: {param}={v} done in {out['wall_s']:.1f} s wall", file=log)

    outs = run_all([task(param, v) for param, v in cells], jobs, on_done=done)
    rows: dict[str, list[dict[str, Any]]] = {"u_low": [], "window_s": []}
    for (param, _), out in zip(cells, outs):
        rows[param].append(out["row"])
    for param in rows:
        best = max(r["tokens_per_s"] for r in rows[param])
        for r in rows[param]:
            r["vs_best"] = r["tokens_per_s"] / best
    return {"workload": workload, "devices": devices, "seed": seed, "prompts": len(scn.batches[0]),
            "defaults": {"u_low": DEFAULT_CONFIG.u_low, "window_s": DEFAULT_CONFIG.window_s,
                         "theta": DEFAULT_CONFIG.theta}, "rows": rows}


def table(result: dict[str, Any]) -> str:
    d = result["defaults"]
    lines = [f"dynarl sensitivity on {result['workload']}, {result['devices']} devices, seed {result['seed']} "
             f"(defaults U_low {d['u_low']}, T {d['window_s']} s, theta {d['theta']})"]
    for param, label in (("u_low", "U_low"), ("window_s", "T (s)")):
        lines.append(f"{label:<8} {'tokens/s':>10} {'vs best':>8} {'iter_s':>8} {'migrations':>10}")
        for r in result["rows"][param]:
            lines.append(f"{r[param]:<8g} {r['tokens_per_s']:>10.1f} {r['vs_best']:>8.3f} {r['iter_time_s']:>8.1f} "
                         f"{r['migrations']:>10d}")
    return "\n".join(lines)


def main(args) -> int:
    result = sweep(args.devices, args.seed, args.iterations, args.warmup, args.prompts, log=sys.stderr,
                   workload=args.workload or WORKLOAD, jobs=args.jobs or default_jobs(len(U_LOW) + len(WINDOW_S)))
    if args.json:
        from dynarl.launch.sim.report import to_json
        print(to_json(result))
    else:
        print(table(result))
    return 0
