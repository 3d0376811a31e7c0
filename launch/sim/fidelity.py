"""`dynarl sim --fidelity`: the same configuration on real processes and in virtual time.

The local launcher runs every rank as its own process over real ZMQ sockets on
the wall clock (uvloop), with the emulated engines sleeping cost-model seconds x
time_scale; the inproc launcher runs the same controller and workers as objects
in a virtual-time loop. Iteration times (real seconds / time_scale) should agree:
what differs is only the real overhead of processes, sockets and encoding,
stretched by 1 / time_scale. Pass when every policy agrees within TOLERANCE.
"""
from __future__ import annotations

import json
import time
from typing import Any

from dynarl.launch.sim.report import rounded
from dynarl.launch.sim.runner import run_policy
from dynarl.launch.sim.scenario import SimConfig, build_scenario

TOLERANCE = 0.10
FIDELITY = dict(workload="math-1.5b-zero", devices=16, prompts=16, iterations=2, warmup=1)
"""16 emulated devices; short responses keep the real-clock run to seconds."""
POLICIES = ("colocated", "spatial")
"""The default. An online policy can be asked for (--policies ...,dynarl): its decisions
read the engines' metrics on the wall clock, so they differ from run to run and from
the virtual-time run's; docs/benchmarks.md records how far."""


def compare(seed: int = 0, time_scale: float = 0.1, policies: tuple[str, ...] = POLICIES) -> dict[str, Any]:
    out: dict[str, Any] = {"config": dict(FIDELITY, seed=seed, time_scale=time_scale), "policies": {}}
    for name in policies:
        times = {}
        for launcher, scale in (("inproc", 1.0), ("local", time_scale)):
            scn = build_scenario(SimConfig(**FIDELITY, seed=seed, policies=(name,), launcher=launcher,
                                           time_scale=scale))
            started = time.perf_counter()
            run = run_policy(scn, name)
            measured = run.iterations[scn.config.warmup:]
            times[launcher] = (sum(r.end - r.start for r in measured) / len(measured), time.perf_counter() - started)
        virtual, local = times["inproc"][0], times["local"][0]
        out["policies"][name] = {"virtual_iter_s": virtual, "local_iter_s": local,
                                 "rel_diff": (local - virtual) / virtual, "local_wall_s": times["local"][1]}
    out["agree"] = all(abs(p["rel_diff"]) <= TOLERANCE for p in out["policies"].values())
    return out


def main(args) -> int:
    policies = tuple(n.strip() for n in args.policies.split(",") if n.strip()) if args.policies else POLICIES
    result = compare(args.seed, args.time_scale, policies)
    print(json.dumps(rounded(result), sort_keys=True, indent=2))
    return 0 if result["agree"] else 1
