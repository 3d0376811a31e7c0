"""One policy's simulated run: the GRPO workflow of `dynarl train`
(components/workflows/grpo.py), its workers on emulated engines, the inproc
launcher and virtual time (or, for `--fidelity`, the local launcher on the wall clock).

    place  -> the policy's placement; GRPO spawns its groups there
    repeat -> GRPO.step (rollout -> reward -> inference -> streaming trainer ->
              weight sync); at each iteration end a policy with a hook may re-plan:
              the groups stop and start on the new placement (RLinf's reboot migration)

An online policy (dynarl and its variants) sets `scheduler.policy: dynarl` and its
`scheduler.dynarl` settings: the job's own scheduler (components/workflows/
dynamic.py, core/scheduler, core/migration) moves devices during every step, as in
`dynarl train`; its log gives the run's moves, decisions and ownership timeline.

Iteration i's window runs from the end of iteration i-1 (from its own start for
i = 0) to its weight sync, so a re-plan at the boundary is paid by the next
iteration; the scheduler's restore (and the next iteration's lending) comes before
the weight sync, so each iteration pays its own. All times are emulated seconds
since the run began: loop time / time_scale.
"""
from __future__ import annotations

import asyncio
import gc
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator

import dynarl
from dynarl.components import costmodel as cm
from dynarl.components.engine_costs import emulated_trainer_min_devices
from dynarl.components.placement.plan import COMPONENTS, Placement, with_unit
from dynarl.components.placement.policy import PlanContext, Replan, Snapshot, make_policy
from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
from dynarl.components.workflows.agentic import TURN_KV, AgenticGRPO, rollout_sums
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.ppo import PPO
from dynarl.components.workloads.prompts import WorkloadPrompts
from dynarl.core.controller import Controller
from dynarl.core.scheduler.log import DeviceCounts, kv_stats

from dynarl.launch.sim.records import IterationRecord, PolicyRun, Quiet, timed
from dynarl.launch.sim.scenario import Scenario, for_policy, train_config

REBOOT_S = cm.role_switch_time(restart=True)
"""A re-plan stops every group and starts it elsewhere: offload/onload plus an engine start."""


def min_devices(scn: Scenario) -> dict[str, int]:
    """The fewest devices each component runs on (the trainer: its state must fit)."""
    return {"trainer": emulated_trainer_min_devices(EmulatedTrainerConfig(**scn.engines["trainer"])),
            "inference": 1, "rollout": scn.rollout_tp}


def run_policy(scn: Scenario, name: str, profiles: dict | None = None, policy=None) -> PolicyRun:
    """Runs one policy (`policy`: an instance to use instead of make_policy(name), e.g. a sweep's)."""
    policy = policy or make_policy(name)
    cfg = scn.config
    scn = for_policy(scn, policy)
    ctx = PlanContext(num_devices=cfg.devices, granularity={"rollout": scn.rollout_tp}, work=scn.work(),
                      switch_s=cm.ROLE_SWITCH_S, micro_batches=cfg.micro_batches,
                      profiles=profiles if policy.needs_profile else None, min_devices=min_devices(scn))
    run = PolicyRun(name, max_staleness=scn.max_staleness)
    placement = with_unit(policy.place(ctx), {"rollout": scn.rollout_tp})
    scheduler = policy.scheduler(cfg.devices // scn.rollout_tp)  # (lending: the rollout's engines at most)

    async def workflow(ctl: Controller) -> None:
        nonlocal placement
        loop = asyncio.get_running_loop()
        origin = loop.time()

        def now() -> float:
            return (loop.time() - origin) / cfg.time_scale

        wf = await start(ctl, scn, placement, scheduler)
        run.placements.append((now(), placement))
        current = [wf]  # (the workflow a re-plan put in its place)
        failing = [ctl.spawn_task(lose_rank(ctl, current, f, origin + f.at_s * cfg.time_scale, run, now),
                                  name=f"fail {f.component}@{f.at_s}") for f in cfg.failures]
        previous_end: float | None = None
        for it in range(cfg.iterations):
            begun = now() if previous_end is None else previous_end
            metrics = await wf.step(it)
            end = now()
            record(run, scn, wf, it, begun, end, origin, metrics)
            previous_end = end
            if not policy.has_hook:
                continue
            snapshot = Snapshot(iteration=it, now_s=end, at_iteration_end=True, placement=placement,
                                stage_s=run.iterations[-1].stage_s)
            for decision in timed(policy, snapshot, run):
                if isinstance(decision, Replan) and it + 1 < cfg.iterations:
                    new = with_unit(decision.placement, {"rollout": scn.rollout_tp})
                    wf = current[0] = await replan(ctl, scn, wf, placement, new, decision.reason, run, it)
                    placement = new
                    run.placements.append((now(), placement))
        for task in failing:  # (one due after the run's end does not come)
            task.cancel()
        if wf.scheduling is not None:  # the scheduler's moves and decisions
            log = wf.scheduling.scheduler.log
            for m in log.migrations:
                run.migrations.setdefault(m.kind, []).append(m.seconds)
            run.decision_ms.extend(d.ms for d in log.decisions)
        for group in wf.worker_groups():
            await ctl.stop_group(group)

    config = train_config(scn, placement, scheduler)
    with few_collections():
        dynarl.run(workflow, config.runtime, virtual_time=cfg.launcher == "inproc")
    return run


GC_THRESHOLD = (50_000, 20, 100)
"""The collector's thresholds during a simulated run (Python's default: 700, 10, 10)."""


@contextmanager
def few_collections() -> Iterator[None]:
    """The run with the objects that exist before it frozen out of the collector
    (gc.freeze) and young generations collected every GC_THRESHOLD allocations instead
    of every 700: at scale a run holds millions of long-lived objects (requests,
    results, tasks), and the default thresholds spent a third of math-7b/256's CPU in
    collections (17 of 50 s, 12 of them in 34 full ones). Collections free only
    reference cycles here and nothing a run observes waits on them (the figures are
    byte-identical), so this changes the wall time only. Restored after the run."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


async def lose_rank(ctl: Controller, current: list, failure: Any, at: float, run: PolicyRun, now: Any) -> None:
    """At loop time `at`, the failure's component loses its first rank (the launcher
    kills it: its calls fail, the controller refuses its channel operations); the
    workflow survives it in place (components/workflows/survival.py)."""
    await asyncio.sleep(max(0.0, at - asyncio.get_running_loop().time()))
    group = getattr(current[0].g, failure.component)
    live = [] if group is None else [h for h in group.handles if h.lost is None and not h.stopped]
    if live:
        ctl.launcher.kill(live[0])
        run.lost_at.append(now())


async def start(ctl: Controller, scn: Scenario, placement: Placement, scheduler: dict | None = None,
                version: int = 0) -> GRPO:
    """GRPO's groups on `placement`, holding weight version `version`."""
    cfg = train_config(scn, placement, scheduler)
    workflow = {"agentic": AgenticGRPO, "ppo": PPO}.get(cfg.workflow, GRPO)
    wf = workflow(ctl, cfg, None, None, None, Quiet(), placement=placement,
                  prompts=WorkloadPrompts(scn.batch, cm.get_model(scn.workload.model).vocab_size))
    wf.open_channels()
    wf.g = await wf.spawn()
    await wf.warm_started()  # (no warm start in a simulation: what follows it, ppo's critic, starts now)
    await wf.sync_weights(version, "start")  # the engines hold no policy until the first sync
    return wf


async def replan(ctl: Controller, scn: Scenario, wf: GRPO, old: Placement, new: Placement, reason: str,
                 run: PolicyRun, it: int) -> GRPO:
    for group in wf.worker_groups():
        await ctl.stop_group(group)
    for name in ("weight_sync", "trainer_dp", "critic_dp"):
        await ctl.process_groups.destroy(name)
    await asyncio.sleep(REBOOT_S * scn.config.time_scale)
    moved = sum(1 for c in COMPONENTS if old.device_ids(c) != new.device_ids(c))
    run.migrations.setdefault("reboot", []).extend([REBOOT_S] * moved)
    run.notes.append(f"after iteration {it}: {old.describe()} -> {new.describe()} ({reason})")
    moved_to = await start(ctl, scn, new, version=it + 1)  # the new engines load the current policy
    moved_to.ledger = wf.ledger  # the run's samples, across the re-plan
    return moved_to


def record(run: PolicyRun, scn: Scenario, wf: GRPO, it: int, start: float, end: float, origin: float,
           metrics: dict) -> None:
    """The iteration's device-seconds, stage times and spans, from the stages' results;
    its tokens (generated in it) and samples (trained in it) from the step's metrics."""
    scale, placement = scn.config.time_scale, wf.placement
    busy_ds = 0.0
    stage_s: dict[str, float] = {}
    label = f"step {it}"
    stats = wf.stage_stats
    ranked = stats.busy()
    for component in COMPONENTS:
        if component not in ranked:  # a trainer that steps on the whole batch: its held spans, below
            continue
        unit = placement.unit_of(component)
        totals = []
        for busy, devices in ranked[component]:
            width = unit if devices is None else devices  # a rollout engine's TP (tail-TP's are wider)
            total = 0.0
            for s, e in busy:
                s, e = (s - origin) / scale, (e - origin) / scale
                total += e - s
                run.busy.append((s, e, width))
            busy_ds += total * width
            totals.append(total)
        stage_s[component] = max(totals)  # the component is done when its slowest rank is
    held = {*COMPONENTS, *(g.name.split("@")[0] for g in wf.worker_groups())} - set(ranked)
    for span in wf.clock.spans:  # calls on held devices that are not stages: a whole-batch step, ppo's critic
        if span.label != label or not span.devices or span.component not in held:
            continue  # (a move's span is no device work)
        s, e = (span.start - origin) / scale, (span.end - origin) / scale
        busy_ds += (e - s) * len(span.devices)
        run.busy.append((s, e, len(span.devices)))
        stage_s[span.component] = stage_s.get(span.component, 0.0) + e - s
    run.preemptions += sum(r.preemptions for r in stats.rollout)
    run.moved_reprefill_tokens.append(sum(r.reprefill_tokens for r in stats.rollout))
    if wf.scheduling is not None:  # what the takers of this iteration's Workload migrations did with the KV
        run.moved_kv.append(kv_stats([m for m in wf.scheduling.scheduler.log.migrations
                                      if start <= (m.started - origin) / scale < end]))
    spans: dict[str, float] = {}
    for span in wf.clock.spans:
        if span.label != label or span.component not in COMPONENTS:
            continue
        spans[span.component] = spans.get(span.component, 0.0) + (span.end - span.start) / scale
        if placement.shares_devices(span.component):
            run.ownership.append((span.component, placement.num_devices_of(span.component),
                                  (span.start - origin) / scale, (span.end - origin) / scale))
    if wf.scheduling is not None:  # ownership changes within the step (moves)
        run.ownership.extend(ownership_spans(wf.scheduling.scheduler.log.counts, origin, scale, start, end))
    else:
        for c in COMPONENTS:
            if not placement.shares_devices(c):
                run.ownership.append((c, placement.num_devices_of(c), start, end))
    if wf.multi_turn:  # the context recomputed on another engine (or after eviction), of the trained episodes
        run.reprefill_tokens.append(stats.episodes["reprefill_tokens"])
        run.turn_kv.append(rollout_sums(stats.rollout, *TURN_KV))
    entry = wf.ledger.entries[-1]  # this iteration's: how far behind the trainer its samples' weights were
    run.staleness_counts.append(Counter(entry.step - v for v in entry.versions))
    run.regenerated.append((metrics.get("regenerated_groups", 0), metrics.get("regenerated_tokens", 0)))
    run.survived.append(metrics.get("survived", 0))
    run.carried.append((metrics.get("carried_groups", 0), metrics.get("carried_tokens", 0),
                        metrics.get("carried_unfinished", 0)))
    run.iterations.append(IterationRecord(it, start, end, busy_ds, tokens=metrics["tokens"],
                                          samples=metrics["samples"], stage_s=stage_s, span_s=spans))


def ownership_spans(counts: list[DeviceCounts], origin: float, scale: float, start: float,
                    end: float) -> list[tuple[str, int, float, float]]:
    """(component, devices, start, end) over [start, end] (run seconds) from the
    scheduler's device counts (loop time)."""
    events = [((c.at - origin) / scale, c.counts) for c in counts]
    points = [e for e in events if e[0] < end]
    out = []
    for i, (t, alloc) in enumerate(points):
        s = max(t, start)
        e = points[i + 1][0] if i + 1 < len(points) else end
        if e <= s:
            continue
        out.extend((c, alloc[c], s, e) for c in COMPONENTS if alloc.get(c, 0) > 0)
    return out
