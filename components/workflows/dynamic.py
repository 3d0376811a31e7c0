"""The DynaRL scheduler inside a GRPO job (scheduler.policy=dynarl), the same in
`dynarl train` and `dynarl sim`: the GlobalScheduler (core/scheduler/loop.py) and
its Mover (core/migration/mover.py) over the job's groups, plugged into the step.

Components: the rollout gives devices by Workload migration; inference takes them
into its running stage (join); the trainer takes them by P2P resharding when it
steps on the whole batch (a barrier), or into its running stage, its state
received peer-to-peer, when it streams (trainer.streaming). Per step:

    begin(live, groups)   the step's work is known; lending's gates close
    start(live)           the ticker starts (owned by the controller's TaskGroup)
    rollout_done()        barrier step: generation is over; one more decision where
                          the train step has not begun; returns the trainer group
    end(live, ...)        the ticker stops (a move in progress completes); back to the
                          configured placement before the weight sync; the step's
                          scheduling metrics

Moves must be cheap to fit in a tail: ranks are parked in warm standby pools and
adopted from there instead of spawned and stopped; with a resharding trainer, warm
standby trainer ranks are started once, two on every device of the placement (it
may come to hold any at the barrier), and it is profiled on them.
"""
from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from dynarl.components import engine_costs
from dynarl.components.experience import PromptGroup
from dynarl.components.rollout.worker import RolloutWorker
from dynarl.components.trainer.base import TrainBatch, data_parts
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows.live import LiveStep
from dynarl.components.workflows.rates import MeasuredRates
from dynarl.components.workflows.stages import Span
from dynarl.core.migration.mover import Mover
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.scheduler.loop import GlobalScheduler, RateSource, StepState
from dynarl.core.scheduler.log import device_stats, kv_stats
from dynarl.core.scheduler.manager import ComponentSpec
from dynarl.core.scheduler.view import StepWork
from dynarl.transport.errors import DynarlError

if TYPE_CHECKING:
    from dynarl.components.workflows.grpo import Groups


class DynamicScheduling:
    def __init__(self, wf: Any, scheduler: GlobalScheduler, mover: Mover, rates: RateSource) -> None:
        self.wf, self.ctl, self.cfg = wf, wf.ctl, wf.cfg
        self.scheduler, self.mover, self.rates = scheduler, mover, rates
        self.state: StepState | None = None
        self._ticker: asyncio.Task | None = None
        self._home: asyncio.Task | None = None
        """Lent devices go home once the rollout is done at the latest."""
        self._failure: DynarlError | None = None
        """What stopped the ticker (a lost rank): the step raises it once its stages are over."""
        self._marks: dict[str, int] = {}
        self._begun = 0.0

    @classmethod
    async def create(cls, wf: Any, groups: Groups) -> "DynamicScheduling":
        cfg, ctl = wf.cfg, wf.ctl
        d = cfg.scheduler.dynarl
        tp = wf.placement.unit_of("rollout")
        streaming = cfg.trainer.streaming
        rates = engine_costs.scheduler_rates(cfg, tp, wf.placement.num_devices)
        time_scale = engine_costs.time_scale(cfg)
        scheduler = GlobalScheduler(
            ctl, "dynarl", rates, d.policy_config(),
            interval_s=d.interval_s, tail_interval_s=d.tail_interval_s, time_scale=time_scale)

        def spec(name: str, kind: str, strategy: str | None, warm: Any = None, **kw: Any) -> ComponentSpec:
            group = getattr(groups, name)
            init = dict(group.handles[0].spec.init_kwargs)  # the job's ranks' own arguments
            return ComponentSpec(name, kind, strategy, init=init,
                                 standby=StandbyPool(ctl, group.cls, name, init, warm=warm), **kw)
        scheduler.register(spec("rollout", "dynamic", None, devices_per_engine=tp, min_devices=tp, inbox="prompts"),
                           groups.rollout)
        scheduler.register(spec("inference", "static", "join" if engine_costs.inference_joins(cfg) else None),
                           groups.inference)
        scheduler.register(spec("trainer", "static", "join" if streaming else "p2p",
                                None if streaming else TrainerWorker.reshard_warm, barrier=not streaming, stateful=True,
                                unit=engine_costs.trainer_unit(cfg),
                                min_devices=engine_costs.trainer_min_devices(cfg)), groups.trainer)
        mover = Mover(ctl, wf.step_ranks(wf), scheduler.managers, scheduler.log, engine_costs.move_costs(cfg),
                      lend=d.lend, tail_tp=d.tail_tp, time_scale=time_scale)
        scheduler.mover = mover
        self = cls(wf, scheduler, mover, rates)
        if not streaming:  # warm standbys where the trainer may reshard to, and its profile on them
            # two per device: a second move in one step makes a new rank beside each current one
            await scheduler.managers["trainer"].spec.standby.fill(2 * mover.devices)
            if isinstance(rates, MeasuredRates):
                await self._profile_trainer(self._step_sized_batch())
        return self

    def busy(self, name: str) -> Any:
        """Held around a section of `name` that no move may interrupt."""
        return self.scheduler.managers[name].gate.busy()

    async def begin(self, live: LiveStep, groups: list[PromptGroup]) -> None:
        """Before the step's prompts go out: its work is known, the components whose
        devices the rollout holds (lending) start gated, and every rollout rank admits
        prompts again (no donor yet)."""
        samples = sum(len(g.samples) for g in groups)
        prompt_mean = sum(len(g.prompt_ids) * len(g.samples) for g in groups) / max(samples, 1)
        multi_turn = self.wf.multi_turn
        cap = None if multi_turn else self.cfg.rollout.max_new_tokens
        self.state = StepState(live, StepWork(samples, prompt_mean, cap, multi_turn))
        for manager in self.scheduler.managers.values():
            manager.begin_cycle()
        if self.mover.lend_enabled and not self.mover.holdings.parked:  # the first step: lend now
            await self.mover.charge(await self.mover.lend(live.version))
        await self.scheduler.group("rollout").call(RolloutWorker.begin_step)  # lent engines too
        live.park(self.mover.holdings.parked)
        live.rollout_lock = not self.mover.holdings.parked
        log = self.scheduler.log
        self._marks = {"decisions": len(log.decisions), "migrations": len(log.migrations), "counts": len(log.counts),
                       "failures": len(log.failures)}
        self._begun = asyncio.get_running_loop().time()

    def start(self, live: LiveStep, label: str) -> None:
        """The ticker starts (its stages registered in `live`); with devices lent to the
        rollout, they go home once it is done at the latest (without this, a policy
        that never moves would leave them parked)."""
        self.scheduler.start()
        self._ticker = self.ctl.spawn_task(self._guarded(self.scheduler.run(self.state)), name=f"scheduler {label}")
        if self.mover.holdings.parked:
            self._home = self.ctl.spawn_task(self._guarded(self._home_after_rollout(live)),
                                             name=f"lent devices home {label}")

    async def _guarded(self, work: Any) -> None:
        try:
            await work
        except DynarlError as exc:
            # A rank the scheduler polls or moves is lost. Raised here, it would take
            # the controller's TaskGroup down mid-step; the step raises it once its
            # stages are over, and the run restarts.
            self._failure = self._failure or exc
            self.scheduler.stop()

    async def _home_after_rollout(self, live: LiveStep) -> None:
        await live.finished("rollout")
        try:
            await self.mover.return_home(live)
        finally:  # whatever happened to the lent engines, the parked stages must run
            live.unpark(self.mover.lendable())

    async def stop(self, raise_failure: bool = True) -> None:
        """The ticker stops (a move in progress completes, or rolls back, first); lent
        devices are home (the rollout is done), or, when the step failed
        (`raise_failure` false), no longer waited for. Then what stopped the ticker
        early (a lost rank) is raised."""
        self.scheduler.stop()
        ticker, home, self._ticker, self._home = self._ticker, self._home, None, None
        if home is not None and not raise_failure:
            home.cancel()
        tasks = [t for t in (ticker, home) if t is not None]
        if tasks:
            await asyncio.wait(tasks)
        failure, self._failure = self._failure, None
        if failure is not None and raise_failure:
            raise failure

    async def rollout_done(self) -> None:
        """Generation is over (a barrier step): one more decision where the train step has
        not begun (engines idle through the tail's end give their devices now; a P2P
        move hands the workflow its new trainer group)."""
        await self.stop()
        await self.scheduler.tick(self.state)

    async def end(self, label: str, *, rollout_end: float, train_end: float, measured: dict[str, Any],
                  last: bool = False) -> dict[str, Any]:
        """The step's stages are over: back to the configured placement (before the
        weight sync; the next step's lending too, unless it is the `last`); returns the
        step's scheduling metrics. `measured`: the step's rollout and inference stats
        and the trainer's (devices, tokens/s)."""
        await self.stop()
        await self.mover.restore(lend=not last)
        for text in self.scheduler.log.failures[self._marks["failures"]:]:  # the step's moves rolled back
            self.wf.progress.note(f"scheduler: {text}")
        metrics = self._scheduling_metrics(train_end, rollout_end, label)
        self._learn(measured)
        return metrics

    # --- the step's figures ---------------------------------------------------------

    def _scheduling_metrics(self, train_end: float, rollout_end: float, label: str) -> dict[str, Any]:
        """The step's migrations (count and seconds per kind:component; start of each
        relative to the rollout's end: negative = inside the tail), decisions and plans."""
        log, marks = self.scheduler.log, self._marks
        decisions = log.decisions[marks["decisions"]:]
        migrations = log.migrations[marks["migrations"]:]
        count: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for m in migrations:
            key = f"{m.kind}:{m.component}"
            count[key] = count.get(key, 0) + 1
            seconds[key] = seconds.get(key, 0.0) + m.seconds
            self.wf.clock.spans.append(Span(f"migrate {m.kind}", list(m.devices), m.started, m.started + m.seconds,
                                            label))
            self.ctl.tracer.complete(f"{m.kind} {m.component} {label}", "migration", "devices", 0,
                                     m.started, m.started + m.seconds, {"devices": list(m.devices)})
        self._donor_spans(migrations, label)
        ms = sorted(d.ms for d in decisions)
        end = asyncio.get_running_loop().time()  # after the restore: back home
        counts = log.counts[marks["counts"]:]
        plans = [{"at_s": d.at, "at_vs_rollout_end_s": d.at - rollout_end,
                  "moves": [list(x) for x in d.plan.moves], "predicted_s": d.plan.predicted_time_s,
                  "current_s": d.plan.current_time_s, "migration_cost_s": d.plan.migration_cost_s,
                  "measured_s": train_end - d.at, "candidates": d.plan.candidates}
                 for d in decisions if d.plan is not None]
        out = {"migrations": count, "migration_s": seconds, "decisions": len(decisions),
               "migrations_in_tail": sum(1 for m in migrations if m.started < rollout_end),
               **kv_stats(migrations),
               "devices": device_stats(log.counts, self._begun, end),
               "device_counts_vs_rollout_end_s": [[c.at - rollout_end, dict(c.counts)] for c in counts],
               "move_cost_s": {name: m.move_cost_s for name, m in self.scheduler.managers.items()},
               "migration_starts_vs_rollout_end_s": [[f"{m.kind}:{m.component}", m.started - rollout_end]
                                                     for m in migrations],
               "decision_ms_p50": ms[len(ms) // 2] if ms else 0.0,
               "decision_ms_p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else 0.0,
               "plans": plans}
        if isinstance(self.rates, MeasuredRates) and "trainer" in self.rates.models:
            model = self.rates.models["trainer"]
            out["trainer_model"] = {"profiled": [list(p) for p in model.points], "correction": model.correction}
        return out

    def _donor_spans(self, migrations: list, label: str) -> None:
        """The rollout stage's span is recorded on the devices it held at its end; the
        engines it released mid-step generated on theirs until the move: show that."""
        rollout = [s for s in self.wf.clock.spans if s.component == "rollout" and s.label == label]
        if not rollout:
            return
        start = min(s.start for s in rollout)
        for m in migrations:
            if m.kind == "workload" and m.component == "rollout" and m.started > start and m.devices:
                # its own label: the stage's time (durations) is the rollout span's, not this
                self.wf.clock.spans.append(Span("rollout", list(m.devices), start, m.started, f"{label} released"))

    def _learn(self, measured: dict[str, Any]) -> None:
        """The predictor's online part (real engines): this step's decode step, the
        trainer's measured rate (it corrects the profile's level), inference's rate."""
        if not isinstance(self.rates, MeasuredRates):
            return
        rollout = measured.get("rollout", [])
        steps = sum(r.engine_steps for r in rollout)
        busy = sum(e - s for r in rollout for s, e in r.busy)
        inference = measured.get("inference", [])
        inference_busy = sum(e - s for r in inference for s, e in r.busy)
        inference_tokens = sum(r.tokens for r in inference)
        ranks = len(inference)  # each on a device of its own; their busy time in parallel
        self.rates.learn_step(
            step_s=busy / steps if steps else None, trainer=measured.get("trainer"),
            inference=(ranks, inference_tokens / (inference_busy / ranks)) if inference_busy > 0 and inference_tokens
            else None)

    # --- the trainer's profile (real engines, a resharding trainer) ----------------------

    async def _profile_trainer(self, batch: TrainBatch) -> None:
        """Profiled points at start: one step of a step-sized batch (`batch`) on warm
        standby ranks at every device count the trainer may come to hold (its own
        devices plus 0..all-but-one of rollout's; scheduler.dynarl.trainer_profile
        home: its own only, linear beyond), each on a throwaway model; tokens/s. On GPUs
        only the device counts where the memory plan has room for that model beside the
        job's own components (a 7B job's GPUs have none: its rate then comes from the
        first step, and the trainer takes no devices before it)."""
        pool = self.scheduler.managers["trainer"].spec.standby
        home, rollout = self.mover.home["trainer"], self.mover.home["rollout"]
        tokens = sum(len(ids) for ids in batch.input_ids)
        points = []
        every = self.cfg.scheduler.dynarl.trainer_profile == "every"
        unit = engine_costs.trainer_unit(self.cfg)
        for extra in range(0, len(rollout), unit) if every else [0]:
            devices = home + rollout[:extra]
            if not self._profile_fits(devices):
                continue
            group = pool.adopt(devices, f"trainer~profile{len(devices)}")
            dp = f"trainer_profile@{len(devices)}" if len(devices) > 1 else None
            try:
                if dp is not None:
                    await self.ctl.process_group(dp, [group])
                await group.call(TrainerWorker.start, dp)
                shards = [[batch.shard(*part).to_wire()] for part in data_parts(group.world_size, unit)]
                begun = time.perf_counter()
                await group.scatter(TrainerWorker.train, shards)
                points.append((len(devices), tokens / (time.perf_counter() - begun)))
            finally:
                if dp is not None:
                    await self.ctl.process_groups.destroy(dp)
                await group.call(TrainerWorker.reshard_retire)
                await pool.park(group)
        if points:  # (none fit on the GPUs: the trainer's rate is learned from its first step)
            self.rates.profile_trainer(points)

    def _profile_fits(self, devices: list[int]) -> bool:
        """On GPUs, whether a throwaway trainer of `devices` ranks fits beside the job's
        own components on each of them (the memory plan); CPU memory is the host's."""
        if self.cfg.runtime.cluster.device_kind != "cuda":
            return True
        from dynarl.components.memory.of_config import plan_of
        from dynarl.components.memory.plan import fits_beside, trainer_rank_bytes

        plan = plan_of(self.cfg)
        return plan is None or fits_beside(plan, devices, trainer_rank_bytes(
            self.cfg, self.cfg.model.config(), plan, len(devices)))

    def _step_sized_batch(self) -> TrainBatch:
        """As many samples as a GRPO step trains, of the task's real lengths: the warm
        start's supervised examples (GRPO's own batch does not exist before step 0)."""
        n = self.cfg.run.prompts_per_step * self.cfg.rollout.samples_per_prompt
        ids: list[list[int]] = []
        plens: list[int] = []
        for i in range(n):
            part = self.wf.warmup_batch(i)
            ids, plens = ids + part.input_ids, plens + part.prompt_lens
            if len(ids) >= n:
                break
        if not ids:
            raise ValueError("the task yields no warm-start examples to profile the trainer with")
        while len(ids) < n:  # a tiny warm-up source: repeat it
            ids, plens = ids + ids[:n - len(ids)], plens + plens[:n - len(plens)]
        return TrainBatch(input_ids=ids[:n], prompt_lens=plens[:n], advantages=[1.0] * n)

