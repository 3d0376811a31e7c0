"""The scheduler's view of a simulated iteration: a policy Snapshot built from what
the running components report and the cost model's throughput points. The rollout
engines' loads (utilization, requests held) and the channels' depths go through
the runtime hypergraph (core/hypergraph.py), as the GlobalScheduler's polls do in
`dynarl train`, and the view is read from its nodes and edges; inference and
trainer progress are read as reported. No oracle lengths: what is not yet
generated is estimated.
"""
from __future__ import annotations

import math
from typing import Any

from dynarl.components import costmodel as cm
from dynarl.components.placement.dynarl import tokens_left
from dynarl.components.placement.plan import Placement
from dynarl.components.placement.policy import Snapshot
from dynarl.components.workflows.live import LiveStep
from dynarl.core.controller import Controller
from dynarl.core.hypergraph import HyperNode

from .migrate import WORKLOAD_MIGRATION_S, Migrator, p2p_cost_s
from .scenario import Scenario

CHANNELS = ("prompts", "rollouts", "experience")
"""The channels whose depth the view reports (the step's prompts, finished groups, scored samples)."""


async def build_snapshot(ctl: Controller, g: Any, it: int, placement: Placement, now, scn: Scenario,
                         live: LiveStep, migrator: Migrator) -> Snapshot:
    ranks = migrator.ranks
    loads = await g.rollout.call(ranks.load_method)
    node = observe_rollout(ctl, g.rollout, loads, ranks.utilization)
    progress = {"inference": await g.inference.call(ranks.progress_method),
                "trainer": await g.trainer.call(ranks.progress_method)}
    batch = scn.batches[it]
    samples = sum(len(grp.samples) for grp in batch)
    prompt_mean = sum(grp.prompt_tokens * len(grp.samples) for grp in batch) / samples
    utilization, queued = node.loads()
    active = sum(queued)
    generated = sum(l["generated"] for l in loads)
    made = generated / active if active else 0.0
    migrator.note_finished([h.spec.worker_id for h in g.rollout.handles], loads)  # released engines keep theirs
    finished = sum(n for n, _ in migrator.finished_seen.values())
    finished_tokens = sum(t for _, t in migrator.finished_seen.values())
    finished_mean = finished_tokens / finished if finished else 0.0
    seq_mean = prompt_mean + max(made, finished_mean)
    cap = output_cap(scn)
    if scn.workload.kind == "math":  # one request is one sample
        remaining = {c: downstream_tokens_left(
            samples=samples, prompt_mean=prompt_mean, finished=finished, finished_tokens=finished_tokens,
            active=active, made=made, finished_mean=finished_mean, cap=cap,
            processed=sum(p["tokens"] for p in progress[c])) for c in progress}
    else:  # multi-turn: a finished request is a turn, not a sample
        remaining = {c: max(0, samples - sum(p["samples"] for p in progress[c])) * seq_mean for c in progress}
    graph = ctl.refresh_graph()
    depth = {name: graph.queued(name) for name in CHANNELS}
    # multi-turn episodes migrate between turns or part-way through one (components/workflows/episodes.py)
    graph.observe_interruptible("rollout", depth["prompts"] == 0 and live.accepts("rollout"))
    return Snapshot(
        iteration=it, now_s=now(), at_iteration_end=False, placement=placement,
        rollout_utilization=utilization, queue_depth=depth,
        devices=migrator.own.current, rollout_engines=tuple(node.workers),
        rollout_active=active, rollout_generated=generated, rollout_finished_mean=finished_mean,
        rollout_max_new_tokens=cap,
        rollout_kv_tokens=sum(l["kv"] for l in loads), rollout_capacity=loads[0]["capacity"],
        remaining_tokens=remaining,
        rate_points=_rate_points(scn, active, prompt_mean + made, seq_mean),
        interruptible={"rollout": node.interruptible},
        accepting={c: live.accepts(c) for c in ("inference", "trainer")},
        migration_cost_s={"workload": WORKLOAD_MIGRATION_S, "p2p": p2p_cost_s(scn)})


def observe_rollout(ctl: Controller, group: Any, loads: list[dict], utilization: str) -> HyperNode:
    """The rollout engines' reports go into the runtime hypergraph (core/hypergraph.py);
    returns the rollout's node, which the view is read from."""
    workers = [h.spec.worker_id for h in group.handles]
    ctl.graph.observe_spawn("rollout", group.cls.__name__, workers, group.devices)
    ctl.graph.observe_load("rollout", workers, [load[utilization] for load in loads],
                           [load["running"] + load["waiting"] for load in loads])
    node = ctl.graph.nodes["rollout"]
    node.kind = "dynamic"
    return node


def output_cap(scn: Scenario) -> int | None:
    """The cap on a math request's output tokens (the workload's max_tokens); None for
    multi-turn, an uncapped distribution, or a trace (its lengths are its own)."""
    if scn.workload.kind != "math" or scn.trace is not None or math.isinf(scn.workload.response_tokens.cap):
        return None
    return int(scn.workload.response_tokens.cap)


def downstream_tokens_left(*, samples: int, prompt_mean: float, finished: int, finished_tokens: float,
                           active: int, made: float, finished_mean: float, cap: int | None,
                           processed: float) -> float:
    """Sequence tokens a downstream component (inference, trainer) still has to process:
    the finished samples' known lengths it has not processed, plus the running requests
    (prompt, made so far, tokens_left) and the unstarted ones (prompt and the finished
    mean). Counting every unprocessed sample at the running requests' mean length
    instead overstated it 2.5x at math-7b/64's first move: in the tail the running
    requests are the long ones."""
    produced = finished_tokens + finished * prompt_mean
    running = prompt_mean + made + tokens_left(made, finished_mean, cap)
    unstarted = prompt_mean + (finished_mean or made)
    future = active * running + max(0, samples - finished - active) * unstarted
    return max(0.0, produced - processed) + future


def _rate_points(scn: Scenario, active: int, context: float, seq_mean: float) -> dict[str, tuple]:
    """The predictor's profiled points, tokens/s, from the cost model: rollout for the
    current active requests spread over e engines; inference and trainer linear in devices."""
    model, device = cm.get_model(scn.workload.model), cm.get_device(scn.config.device)
    tp, n = scn.rollout_tp, scn.config.devices
    max_seqs = scn.engines["rollout"].get("max_num_seqs", 1024)
    points = []
    for e in sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, n // tp} - {0}):
        if e > n // tp:
            continue
        b = max(1, min(max_seqs, math.ceil(active / e))) if active else 1
        points.append((e * tp, e * b / cm.decode_step_time(model, device, b, max(context, 1.0), tp)))
    tokens = 1_000_000
    trainer = scn.engines["trainer"]
    t1 = tokens / cm.train_time(model, device, tokens, seq_mean, 1, trainer.get("mfu", cm.DEFAULT_MFU),
                                trainer.get("recompute", False))
    i1 = tokens / cm.logprob_time(model, device, tokens, seq_mean, 1)
    return {"rollout": tuple(points), "trainer": ((1, t1), (n, t1 * n)), "inference": ((1, i1), (n, i1 * n))}
