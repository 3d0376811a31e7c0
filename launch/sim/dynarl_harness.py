"""The online (dynarl-family) policies' simulated run, on the simulator's own
workers and harness: the real Controller, inproc workers, virtual time. To be
replaced by the GRPO workflow with core/scheduler's harness (runner.py runs every
other policy that way already).

    place  -> spawn one WorkerGroup per component on the placement's devices
    repeat -> run_iteration (iteration.py); decide() where the policy has a hook;
              a Replan decision re-deploys the groups at the iteration boundary
              (RLinf: checkpoint, stop, start elsewhere: a reboot migration)

Iteration i's window runs from the end of iteration i-1 (from its own start for
i = 0) to its weight sync, so boundary work (re-plans) is paid by the next iteration.
All times are emulated seconds since the run began: loop time / time_scale.
"""
from __future__ import annotations

import asyncio

import dynarl
from dynarl.components import costmodel as cm
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.placement.policy import Migrate, PlanContext, Replan, Snapshot, make_policy
from dynarl.components.workflows.stages import StageClock
from dynarl.components.workloads.samples import batch_tokens
from dynarl.core.controller import Controller
from dynarl.core.worker_group import gather_or_cancel

from .inference_worker import SimInferenceWorker
from .records import IterationRecord, PolicyRun, timed
from .iteration import LiveIteration, SimGroups, open_channels, run_iteration, sync_weights
from .migrate import Migrator, min_devices
from .rollout_worker import SimRolloutWorker
from .scenario import Scenario, for_policy, nic_or_link
from .snapshot import build_snapshot
from .trainer_worker import SimTrainerWorker

REBOOT_S = cm.role_switch_time(restart=True)
"""A re-plan stops every group and starts it elsewhere: offload/onload plus an engine start."""


def run_online(scn: Scenario, name: str, profiles: dict | None = None, policy=None) -> PolicyRun:
    """Runs one policy (`policy`: an instance to use instead of make_policy(name), e.g. a sweep's)."""
    cfg = scn.config
    policy = policy or make_policy(name)
    scn = for_policy(scn, policy)  # agentic: the policy's queue order and turn affinity (scenario.py)
    ctx = PlanContext(num_devices=cfg.devices, granularity={"rollout": scn.rollout_tp}, work=scn.work(),
                      switch_s=cm.ROLE_SWITCH_S, micro_batches=cfg.micro_batches,
                      profiles=profiles if policy.needs_profile else None, min_devices=min_devices(scn))
    run = PolicyRun(name)
    placement = policy.place(ctx)
    capacity = max(1024, 2 * max(sum(len(g.samples) for g in b) for b in scn.batches) + 2 * cfg.devices)

    async def workflow(ctl: Controller) -> None:
        nonlocal placement
        loop = asyncio.get_running_loop()
        origin = loop.time()

        def now() -> float:
            return (loop.time() - origin) / cfg.time_scale

        open_channels(ctl, capacity)
        g = await spawn(ctl, scn, placement)
        run.placements.append((now(), placement))
        borrow = getattr(policy, "rollout_borrows", False)
        tail_tp = getattr(policy, "tail_tp", False)
        migrator = Migrator(ctl, scn, placement, lambda kind, s: run.migrations.setdefault(kind, []).append(s), now,
                            borrow=borrow, tail_tp=tail_tp)
        previous_end: float | None = None
        for it in range(cfg.iterations):
            start = now() if previous_end is None else previous_end
            if it > 0:
                await migrator.restore(g, it)  # paid by this iteration: its window began at the last end
            elif borrow:
                await asyncio.sleep(await migrator.lend(g, it) * cfg.time_scale)
            clock = StageClock()
            live = LiveIteration(it, borrowed=bool(migrator.lent))
            work = asyncio.ensure_future(run_iteration(ctl, g, scn.batches[it], it, clock=clock, live=live,
                                                       chunk_size=cfg.chunk_size, weight_bytes=scn.weight_bytes,
                                                       sync_lock=migrator.lock))
            ticker = asyncio.ensure_future(_ticker(ctl, g, policy, run, it, placement, now, scn, live, migrator))
            home = asyncio.ensure_future(_home_after_rollout(g, live, migrator))
            try:
                done, _ = await asyncio.wait([work, ticker, home], return_when=asyncio.FIRST_COMPLETED)
                for side in (ticker, home):
                    if side in done:
                        side.result()  # a failed hook ends the run
                results = await work
                async with migrator.lock:  # a migration in flight finishes before its task is cancelled
                    ticker.cancel()
                    home.cancel()
            finally:
                work.cancel()
                ticker.cancel()
                home.cancel()
            end = now()
            _record(run, scn, it, start, end, placement, results, clock, origin, cfg.time_scale, migrator)
            previous_end = end
            if policy.has_hook:
                snapshot = Snapshot(iteration=it, now_s=end, at_iteration_end=True, placement=placement,
                                    stage_s=run.iterations[-1].stage_s)
                for decision in timed(policy, snapshot, run):
                    if isinstance(decision, Migrate):
                        # Migrations happen inside an iteration (the ticker); between
                        # iterations a policy re-plans the whole placement instead.
                        raise ValueError("a policy asked to Migrate at an iteration's end: return Replan there")
                    if isinstance(decision, Replan) and it + 1 < cfg.iterations:
                        await migrator.stop_pools()  # the new placement's Migrator starts its own
                        g = await _replan(ctl, scn, g, placement, decision, run, it)
                        placement = decision.placement
                        run.placements.append((now(), placement))
                        migrator = Migrator(ctl, scn, placement, migrator.record, now, borrow=borrow,
                                            tail_tp=tail_tp)
                        migrator.own.events = [(now(), {c: placement.num_devices_of(c) for c in COMPONENTS})]
        for group in g.all():
            await ctl.stop_group(group)

    config = dynarl.RuntimeConfig(launcher=cfg.launcher, cluster=_cluster(cfg.devices),
                                  spawn_timeout_s=600.0, heartbeat_timeout_s=30.0)
    dynarl.run(workflow, config, virtual_time=cfg.launcher == "inproc")
    return run


def _cluster(devices: int) -> dynarl.ClusterConfig:
    per_node = 8 if devices % 8 == 0 else devices
    return dynarl.ClusterConfig(num_nodes=devices // per_node, devices_per_node=per_node)


async def spawn(ctl: Controller, scn: Scenario, placement: Placement) -> SimGroups:
    engines = scn.engines
    tp = scn.rollout_tp
    rollout_engine = dict(engines["rollout"], weight_sync_bandwidth=nic_or_link(
        placement.segment_of("rollout") == placement.segment_of("trainer"), scn.config.device))
    rollout, inference, trainer = await gather_or_cancel([
        ctl.spawn(SimRolloutWorker, name="rollout", devices=placement.device_ids("rollout")[::tp],
                  init={"engine": rollout_engine, "shares_device": placement.shares_devices("rollout")}),
        ctl.spawn(SimInferenceWorker, name="inference", devices=placement.device_ids("inference"),
                  init={"engine": engines["inference"], "shares_device": placement.shares_devices("inference")}),
        ctl.spawn(SimTrainerWorker, name="trainer", devices=placement.device_ids("trainer"),
                  init={"engine": engines["trainer"], "shares_device": placement.shares_devices("trainer")})])
    return SimGroups(rollout, inference, trainer)


async def _replan(ctl: Controller, scn: Scenario, g: SimGroups, old: Placement, decision: Replan,
                  run: PolicyRun, it: int) -> SimGroups:
    for group in g.all():
        await ctl.stop_group(group)
    await asyncio.sleep(REBOOT_S * scn.config.time_scale)
    moved = sum(1 for c in COMPONENTS if old.device_ids(c) != decision.placement.device_ids(c))
    run.migrations.setdefault("reboot", []).extend([REBOOT_S] * moved)
    run.notes.append(f"after iteration {it}: {old.describe()} -> {decision.placement.describe()} ({decision.reason})")
    g = await spawn(ctl, scn, decision.placement)
    await sync_weights(g, it + 1, scn.weight_bytes)  # the new engines load the current policy
    return g


async def _home_after_rollout(g: SimGroups, live: LiveIteration, migrator: Migrator) -> None:
    """Devices the rollout borrowed go back to inference and trainer once it is done at
    the latest (without this, a policy that never migrates would leave them parked)."""
    if not live.borrowed:
        await asyncio.Future()  # nothing lent: wait to be cancelled
    while "rollout" not in live.done:  # run_iteration registers it once the prompts are out
        await asyncio.sleep(0)
    await asyncio.wait([live.done["rollout"]])
    await migrator.return_home(g, live)
    await asyncio.Future()


async def _ticker(ctl: Controller, g: SimGroups, policy, run: PolicyRun, it: int, placement: Placement,
                  now, scn: Scenario, live: LiveIteration, migrator: Migrator) -> None:
    """decide() every decide_every_s during the iteration; Migrate decisions are executed
    at once (migrate.py), while the iteration goes on."""
    if policy.decide_every_s is None:
        await asyncio.Future()  # no online hook: wait to be cancelled
    while True:
        await asyncio.sleep(policy.decide_every_s * scn.config.time_scale)
        snapshot = await build_snapshot(ctl, g, it, placement, now, scn, live, migrator)
        for decision in timed(policy, snapshot, run):
            if not isinstance(decision, Migrate):
                raise NotImplementedError(f"{type(decision).__name__} during an iteration")
            await migrator.execute(g, decision, live)


def _record(run: PolicyRun, scn: Scenario, it: int, start: float, end: float, placement: Placement,
            results: dict, clock: StageClock, origin: float, scale: float, migrator: Migrator) -> None:
    _check_exactly_once(scn, it, results["trainer"])
    busy_ds = 0.0
    stage_s: dict[str, float] = {}
    for component, per_rank in results.items():
        totals = []
        for r in per_rank:
            total = 0.0
            for s, e in r["busy"]:
                s, e = (s - origin) / scale, (e - origin) / scale
                total += e - s
                run.busy.append((s, e, r["tp"]))
            busy_ds += total * r["tp"]
            totals.append(total)
            run.preemptions += r.get("preemptions", 0)
        stage_s[component] = max(totals)  # the component is done when its slowest rank is
    run.reprefill_tokens.append(sum(r.get("reprefill_tokens", 0) for r in results["rollout"]))
    label = f"iteration {it}"
    spans: dict[str, float] = {}
    for span in clock.spans:
        if span.label != label:
            continue
        spans[span.component] = spans.get(span.component, 0.0) + (span.end - span.start) / scale
        if placement.shares_devices(span.component):
            run.ownership.append((span.component, placement.num_devices_of(span.component),
                                  (span.start - origin) / scale, (span.end - origin) / scale))
    if placement.mode == "spatial":  # per-device ownership may change during the iteration (migrations)
        run.ownership.extend(migrator.own.spans(start, end))
    else:
        for c in COMPONENTS:
            if not placement.shares_devices(c):
                run.ownership.append((c, placement.num_devices_of(c), start, end))
    tokens, samples = batch_tokens(scn.batches[it])
    run.iterations.append(IterationRecord(it, start, end, busy_ds, tokens=tokens, samples=samples,
                                          stage_s=stage_s, span_s=spans))


def _check_exactly_once(scn: Scenario, it: int, trainer_results: list[dict]) -> None:
    """Every sample of the batch reached the trainer exactly once (migrations included)."""
    ids = [i for r in trainer_results for i in r.pop("ids", ())]
    expected = sum(len(grp.samples) for grp in scn.batches[it])
    if len(ids) != expected or len(set(ids)) != expected:
        raise RuntimeError(f"iteration {it}: the trainer got {len(ids)} samples ({len(set(ids))} distinct), "
                           f"the batch has {expected}")
