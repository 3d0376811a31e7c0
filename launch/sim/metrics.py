"""Per-policy figures from a run's records (measured iterations only).

    iter_time_s       mean window of the measured iterations
    tokens_per_s      generated tokens / s (math);  requests_per_s: episodes / s (agentic)
    gpu_idle_frac     1 - device-seconds some component computed / (N x time)
    bound_s           mean lower bound (bound.py); ratio_to_bound = iter_time_s / bound_s
    migrations        per kind (reboot, workload, p2p, switch: parked inference/trainer onloading
                      on their devices, join: the rollout's engines rejoining at an iteration's
                      end): count and total cost in seconds
    moved_reprefill_tokens  per iteration: tokens of requests a migration moved (Workload,
                      tail-TP) that their new engines computed again (dynarl-kv: the last block)
    moved_kv          per iteration (dynarl-kv): requests whose KV the takers moved in, its
                      tokens and transfer seconds, and requests they chose to prefill again
    turn_kv           the same for follow-up turns whose last engine a migration released
                      (agentic, dynarl-kv: that engine offers the KV of their context)
    decisions         the scheduler's decisions and iteration-end hooks; decision_ms_p99 their
                      wall-clock p99 (0 without either)
    staleness_max     versions between a trained sample's generating weights and the trainer's
                      (async: 1). With a policy that overlaps steps in the run, no policy's
                      last iteration is measured (measured_window), and the overlapping
                      policy's iteration times its next batch's rollout beside this batch's
                      training: its busy time and tokens mix two batches (measure several
                      iterations); staleness_hist counts the measured samples by it
    regenerated_groups, _tokens  per iteration (partial rollout): groups with samples started
                      again from their prompt because their oldest token would have been
                      trained over the policy's bound, and the tokens dropped with them
    carried_tokens    (partial rollout) the backlog of tokens started and not trained when the
                      measured iterations begin and when they end
"""
from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from dynarl.components.placement.plan import COMPONENTS

from dynarl.launch.sim.records import PolicyRun

if TYPE_CHECKING:
    from dynarl.launch.sim.scenario import Scenario

MIGRATION_KINDS = ("reboot", "workload", "p2p", "switch", "join")


def policy_metrics(run: PolicyRun, scn: Scenario, *, timings: bool) -> dict[str, Any]:
    cfg = scn.config
    window = measured_window(cfg)
    measured = run.iterations[window]
    total = sum(r.end - r.start for r in measured)
    n = len(measured)
    bound = sum(scn.bounds[r.index].bound_s for r in measured) / n
    iter_time = total / n
    out: dict[str, Any] = {
        "iter_time_s": iter_time,
        "bound_s": bound,
        "ratio_to_bound": iter_time / bound,
        "work_bound_s": sum(sum(scn.bounds[r.index].work_s.values()) / cfg.devices for r in measured) / n,
        "critical_path_s": sum(scn.bounds[r.index].critical_path_s for r in measured) / n,
        "gpu_idle_frac": 1.0 - sum(r.busy_device_s for r in measured) / (cfg.devices * total),
        "stage_s": {c: sum(r.span_s.get(c, 0.0) for r in measured) / n for c in COMPONENTS},
        "migrations": {k: {"count": len(run.migrations.get(k, [])), "cost_s": sum(run.migrations.get(k, []))}
                       for k in MIGRATION_KINDS},
        "decisions": len(run.decision_ms),
        "placement": run.placements[0][1].to_dict(),
        "replans": list(run.notes),
        "preemptions": run.preemptions,
        "moved_reprefill_tokens": sum(run.moved_reprefill_tokens[window]) / n,  # per iteration
        "staleness_max": max(run.staleness[window], default=0),
        "staleness_hist": {str(k): v for k, v in sorted(sum(run.staleness_counts[window], Counter()).items())},
        "regenerated_groups": sum(g for g, _ in run.regenerated[window]) / n,  # per iteration
        "regenerated_tokens": sum(t for _, t in run.regenerated[window]) / n,
        # the backlog (carried tokens) when the measured iterations begin and when they end:
        # growth is work they left to later steps, a shrink work they did for earlier ones
        "carried_tokens": [run.carried[window.start - 1][1] if window.start > 0 else 0, run.carried[window][-1][1]],
    }
    for name in ("moved_kv", "turn_kv"):  # per iteration
        kv = getattr(run, name)[window]
        if kv:
            out[name] = {k: sum(x[k] for x in kv) / n for k in kv[0]}
    if len(run.placements) > 1:
        out["final_placement"] = run.placements[-1][1].to_dict()
    if scn.workload.kind == "math":
        out["tokens_per_s"] = sum(r.tokens for r in measured) / total
    else:
        out["requests_per_s"] = sum(r.samples for r in measured) / total
        out["reprefill_tokens"] = sum(run.reprefill_tokens[window]) / n  # per iteration (episodes.py)
    if not run.decision_ms:
        out["decision_ms_p99"] = 0.0
    elif timings:
        out["decision_ms_p99"] = percentile(run.decision_ms, 99)
    else:
        out["decision_ms_p99"] = None  # wall-clock: only with --timings (it breaks byte-identity)
    return out


def measured_window(cfg: Any) -> slice:
    """The iterations every policy of the run is measured on: after the warm-up, and
    when a policy overlaps each step with the next k steps' rollout (max_staleness k),
    not the last k either (they have fewer or no later rollouts to make), for all of
    them alike."""
    from dynarl.components.placement.policy import make_policy, overlaps
    from dynarl.launch.sim.scenario import staleness_of
    depth = max((staleness_of(p, cfg) for p in map(make_policy, cfg.policies) if overlaps(p)), default=0)
    return slice(cfg.warmup, cfg.iterations - depth)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def add_speedups(policies: dict[str, dict[str, Any]], baseline: str = "colocated") -> None:
    base = policies[baseline]["iter_time_s"]
    for m in policies.values():
        m["speedup_vs_colocated"] = base / m["iter_time_s"]


def fail_metrics(clean: PolicyRun, faulty: PolicyRun) -> dict[str, Any]:
    """What losing ranks cost a policy (SimConfig.failures), against its run without:
    the whole run's extra seconds, the iteration times side by side, the ranks lost and
    replaced in place, and whether every iteration trained the same samples."""
    end = lambda run: run.iterations[-1].end if run.iterations else 0.0
    return {"lost": len(faulty.lost_at), "lost_at_s": list(faulty.lost_at), "replaced": sum(faulty.survived),
            "cost_s": end(faulty) - end(clean),
            "iter_time_s": [r.end - r.start for r in faulty.iterations],
            "clean_iter_time_s": [r.end - r.start for r in clean.iterations],
            "same_samples": [r.samples for r in faulty.iterations] == [r.samples for r in clean.iterations]}
