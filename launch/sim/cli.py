"""`dynarl sim`: run policies on the same simulated workload and compare them.

    dynarl sim --workload math-7b --devices 64 --policies colocated,spatial,rlinf-auto --json
    dynarl sim --workload agentic-rstar --devices 64,128 --policies colocated,dynarl-noprio,dynarl

Several device counts run one after another; --json then prints one object with
a result per count under "runs" (in the order given).

Every policy runs the real controller, workflow and placement with inproc emulated
workers in virtual time (see docs/simulation.md). colocated always runs, as the
baseline of speedup_vs_colocated. The JSON is byte-identical for one seed; with
--timings it adds wall-clock figures (decision_ms_p99, wall_s), which are not.
`dynarl sim --help` lists the policies, the devices and the table's columns (epilog).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

from dynarl.components.costmodel import DEVICES
from dynarl.components.placement.policy import REGISTRY, PolicyUnavailable, describe, make_policy
from dynarl.components.workloads.catalog import WORKLOADS
from dynarl.components.workloads.trace import TraceError

from dynarl.launch.sim.metrics import add_speedups, fail_metrics, measured_window, policy_metrics
from dynarl.launch.sim.parallel import default_jobs
from dynarl.launch.sim.report import table, to_json
from dynarl.launch.sim.scenario import Failure, SimConfig, build_scenario

MAX_LISTED_REJECTS = 20


def device_counts(text: str) -> list[int]:
    """"64" or "64,128": positive device counts."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--devices takes counts like 64 or 64,128, got {text!r}") from None
    if not counts or any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"--devices takes positive counts, got {text!r}")
    return counts


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


DEFAULT_POLICIES = "colocated,spatial,rlinf-auto"
DEFAULT_ITERATIONS = 3
"""Per policy, one warm-up included: two measured iterations (the async policy needs three)."""
SWEEP_ITERATIONS = 2
"""--sweep's default: it runs many rows (one measured iteration each, as its documented figures)."""

COLUMNS = (
    ("iter_time_s", "mean time of a measured iteration (virtual seconds)"),
    ("tokens_per_s", "generated tokens per second (math; agentic: requests_per_s, episodes per "
                     "second; embodied: env_steps_per_s)"),
    ("gpu_idle", "fraction of the devices' time in which no component computed"),
    ("bound_s", "a lower bound on one iteration's time whatever the policy: max(total work / "
                "devices, the critical path) (launch/sim/bound.py)"),
    ("ratio", "iter_time_s / bound_s: 1.00 would be optimal"),
    ("speedup", "colocated's iter_time_s / this policy's"),
    ("dec_ms_p99", "p99 wall-clock milliseconds of the policy's decisions (scheduler moves, re-plans): "
                   "'-' without --timings, 0.00 when it made none"),
    ("placement", "the starting placement: devices per segment ('|' between segments, '+' joins "
                  "components that time-share devices)"),
)
CALIBRATION = ("The cost model (components/costmodel.py, docs/COSTMODEL.md) takes its device figures from "
               "datasheets and papers and is not yet calibrated on a GPU: its times are estimates, for "
               "comparing policies with one another, not a prediction of a real cluster's.")


def epilog() -> str:
    """The policies, devices and columns, one line each (--help)."""
    import textwrap
    width = max(map(len, REGISTRY)) + 2

    def item(name: str, text: str, indent: int) -> str:
        return textwrap.fill(text, 100, initial_indent=f"  {name.ljust(indent)}", subsequent_indent=" " * (indent + 2),
                             break_on_hyphens=False)
    lines = ["policies (--policies; colocated always runs, as the baseline of speedup):"]
    lines += [item(name, describe(name), width) for name in REGISTRY]
    lines += ["", "devices (--device), as the cost model prices them:"]
    lines += [item(d.name, f"{d.memory_bytes / 1e9:g} GB, {d.hbm_bandwidth / 1e12:g} TB/s memory, "
                           f"{d.bf16_flops / 1e12:g} TFLOP/s bf16", width) for d in DEVICES.values()]
    lines += ["", "columns of the table (per policy, over the measured iterations; --json: launch/sim/metrics.py):"]
    lines += [item(name, text, width) for name, text in COLUMNS]
    return "\n".join(lines + ["", textwrap.fill(CALIBRATION, 100)])


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dynarl sim", description=__doc__.split("\n\n")[0], epilog=epilog(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", help=f"one of: {', '.join(sorted(WORKLOADS))} (default math-7b; "
                                      "with --sweep, math-1.5b)")
    p.add_argument("--devices", type=device_counts, default=[64],
                   help="devices, or a comma-separated list of counts run one after another (default 64)")
    p.add_argument("--policies", default=None,
                   help="comma-separated policy names, listed below (default colocated,spatial,rlinf-auto; "
                        "with --fidelity, colocated,spatial); async needs --iterations 3 or more, partial "
                        "rollout is measured with --iterations 5 --warmup 2")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed (default 0): its prompts and lengths")
    p.add_argument("--trace", help="JSONL trace replacing the workload's generator")
    p.add_argument("--iterations", type=int, default=None,
                   help=f"per policy, warm-up included (default {DEFAULT_ITERATIONS}: {DEFAULT_ITERATIONS - 1} "
                        f"measured; with --sweep, {SWEEP_ITERATIONS})")
    p.add_argument("--warmup", type=int, default=1, help="the first iterations, not measured (default 1)")
    p.add_argument("--prompts", type=int, help="prompts per iteration (default: the workload's rule)")
    p.add_argument("--device", default="h100-80gb", choices=sorted(DEVICES), metavar="DEVICE",
                   help=f"the emulated device the cost model prices: {', '.join(sorted(DEVICES))} (default "
                        "h100-80gb; listed below); not calibrated on a GPU yet")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--timings", action="store_true", help="add wall-clock figures to the JSON")
    p.add_argument("--plot", metavar="DIR", help="write the ownership timelines and a bar chart there")
    p.add_argument("--sweep", action="store_true",
                   help="dynarl's sensitivity to U_low and T (window), on math-1.5b unless --workload "
                        "(DynaRL Fig 15)")
    p.add_argument("--fidelity", action="store_true",
                   help="compare the local launcher (real processes, wall clock) with virtual time")
    p.add_argument("--time-scale", type=float, default=0.1,
                   help="--fidelity: real seconds per emulated second on the local launcher")
    p.add_argument("--fail", default=None, metavar="COMPONENT@SECONDS[,...]",
                   help="lose the component's first rank (rollout, reward, inference) at that run second; each "
                        "policy runs with the losses and without, side by side (static policies only)")
    p.add_argument("--max-staleness", type=positive_int, default=None, metavar="K",
                   help="algorithm.max_staleness of every asynchronous policy (async, partial, dynarl-async) "
                        "alike, in place of each one's own (async 1, partial unbounded, dynarl-async 1)")
    p.add_argument("--jobs", type=positive_int, default=None,
                   help="policies (or --sweep rows) run at once, each in a process of its own; the output "
                        "is the same (default: one per core, at most one per run)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.iterations is None:
        args.iterations = SWEEP_ITERATIONS if args.sweep else DEFAULT_ITERATIONS
    if (args.sweep or args.fidelity) and len(args.devices) > 1:
        print("dynarl sim: --sweep and --fidelity take one device count", file=sys.stderr)
        return 2
    if args.sweep or args.fidelity:
        args.devices = args.devices[0]
    if args.fidelity:
        from dynarl.launch.sim.fidelity import main as fidelity_main
        return fidelity_main(args)
    if args.sweep:
        from dynarl.launch.sim.sweep import main as sweep_main
        return sweep_main(args)
    names = [n.strip() for n in (args.policies or DEFAULT_POLICIES).split(",") if n.strip()]
    try:
        for name in names:
            make_policy(name)
        if "colocated" not in names:
            names.insert(0, "colocated")
        # every scenario is built (and checked) before the first one runs
        failures = tuple(Failure.parse(part) for part in (args.fail or "").split(",") if part.strip())
        scenarios = [build_scenario(SimConfig(
            workload=args.workload or "math-7b", devices=devices, policies=tuple(names), seed=args.seed,
            iterations=args.iterations, warmup=args.warmup, prompts=args.prompts, trace=args.trace,
            device=args.device, failures=failures, max_staleness=args.max_staleness)) for devices in args.devices]
    except (PolicyUnavailable, TraceError, ValueError, OSError) as exc:
        print(f"dynarl sim: {exc}", file=sys.stderr)
        return 2
    scn = scenarios[0]
    if getattr(scn, "trace", None) is not None and scn.trace.rejected:
        print(f"dynarl sim: {len(scn.trace.rejected)} malformed trace line(s) rejected:", file=sys.stderr)
        for line, reason in scn.trace.rejected[:MAX_LISTED_REJECTS]:
            print(f"  line {line}: {reason}", file=sys.stderr)
    results = []
    for scn in scenarios:
        if len(scenarios) > 1:
            print(f"dynarl sim: {scn.config.devices} devices", file=sys.stderr)
        folder = None
        if args.plot:
            folder = args.plot if len(scenarios) == 1 else os.path.join(args.plot, f"devices-{scn.config.devices}")
        jobs = args.jobs or default_jobs(len(scn.config.policies))
        if scn.workload.kind == "embodied":  # (its own runner: launch/sim/embodied.py; no timelines to plot)
            from dynarl.launch.sim.embodied import simulate as simulate_embodied
            result, folder = simulate_embodied(scn, log=sys.stderr, jobs=jobs), None
        else:
            result, _ = simulate(scn, timings=args.timings, log=sys.stderr, jobs=jobs, plot_dir=folder)
        results.append(result)
        if not args.json:
            print(table(result))
        if folder is not None:
            from dynarl.launch.sim.plot import write_policies
            print(f"dynarl sim: wrote {write_policies(result, folder)}", file=sys.stderr)
    if args.json:
        print(to_json(results[0] if len(results) == 1 else {"runs": results}))
    return 0


def simulate(scn, *, timings: bool = False, log: Any = None, jobs: int = 1,
             plot_dir: str | None = None) -> tuple[dict[str, Any], dict]:
    """Runs every policy of the scenario, `jobs` at a time (parallel.py: forked children,
    same output); returns (the result dict, the PolicyRuns: only those run in this
    process, i.e. all of them with jobs 1). `plot_dir`: each run writes its timeline
    there (the policies' bar chart needs every result: plot.write_policies, after)."""
    from dynarl.launch.sim.parallel import run_all
    from dynarl.launch.sim.profiler import profile_stages
    from dynarl.launch.sim.runner import run_policy

    cfg = scn.config
    profiles = None
    if any(make_policy(n).needs_profile for n in cfg.policies):
        started = time.perf_counter()
        profiles = profile_stages(scn)  # once, before the runs: every policy that needs it gets the same
        if log is not None:
            print(f"dynarl sim: stage profiles in {time.perf_counter() - started:.1f} s wall", file=log)
    runs: dict = {}

    clean = dataclasses.replace(scn, config=dataclasses.replace(cfg, failures=())) if cfg.failures else scn

    def task(name: str):
        def run() -> dict[str, Any]:
            started = time.perf_counter()
            runs[name] = policy_run = run_policy(clean, name, profiles)
            metrics = policy_metrics(policy_run, clean, timings=timings)
            if cfg.failures:  # the same policy losing ranks, beside it
                metrics["fail"] = fail_metrics(policy_run, run_policy(scn, name, profiles))
            wall = time.perf_counter() - started
            if timings:
                metrics["wall_s"] = wall
            paths = []
            if plot_dir is not None:
                from dynarl.launch.sim.plot import write_timeline
                paths.append(write_timeline(name, policy_run, scn, plot_dir))
            return {"metrics": metrics, "wall_s": wall, "paths": paths}
        return run

    def done(i: int, out: dict[str, Any]) -> None:
        if log is not None:
            print(f"dynarl sim: {cfg.policies[i]} done in {out['wall_s']:.1f} s wall", file=log)
            for path in out["paths"]:
                print(f"dynarl sim: wrote {path}", file=log)

    outs = run_all([task(name) for name in cfg.policies], jobs, on_done=done)
    policies: dict[str, dict[str, Any]] = {name: out["metrics"] for name, out in zip(cfg.policies, outs)}
    add_speedups(policies)
    result: dict[str, Any] = {
        "workload": cfg.workload, "kind": scn.workload.kind, "devices": cfg.devices, "seed": cfg.seed,
        "device": cfg.device, "prompts": len(scn.batches[0]), "iterations": cfg.iterations,
        "measured_iterations": len(range(cfg.iterations)[measured_window(cfg)]), "policies": policies,
    }
    if cfg.failures:
        result["failures"] = [f"{f.component}@{f.at_s:g}" for f in cfg.failures]
    if scn.trace is not None:
        result["trace"] = {"file": cfg.trace, "groups": len(scn.trace.groups), "requests": scn.trace.num_requests,
                           "rejected": len(scn.trace.rejected),
                           "rejected_lines": [n for n, _ in scn.trace.rejected[:MAX_LISTED_REJECTS]]}
    return result, runs
