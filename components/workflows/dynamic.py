"""The DynaRL wiring of the GRPO job (scheduler.policy=dynarl): the scheduler that
GRPO's step calls before the rollout, after it and after the train step.

Per step: a ticker (owned by the controller's TaskGroup) lets the GlobalScheduler
move idle rollout engines to the trainer in the rollout's long tail (Workload out
of rollout, P2P into the trainer); non-interruptible sections hold their
component's gate; after the train step the configured placement is restored,
and the step's migrations (when each started relative to the rollout's end),
decision times and plans (predicted vs measured) go into its metrics, with each
component's device count over the step (mean, min, max: the trackers' series) and
after every move (metrics.jsonl's timeline).

Moves must be cheap to fit in a tail: warm standby trainer ranks are started
once, on every device the trainer may come to hold (the rollout's and its own),
and P2P migrations adopt and park them instead of spawning and stopping
processes; released rollout engines are parked too and rejoin on restore.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from dynarl.components.trainer.base import TrainBatch
from dynarl.components.workflows.stages import Span
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.scheduler.loop import GlobalScheduler, device_stats
from dynarl.core.scheduler.manager import ComponentSpec
from dynarl.core.scheduler.policy import DynarlConfig
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from dynarl.core.worker_group import WorkerGroup
from dynarl.transport.errors import DynarlError


TAIL_TICK_S = 0.01
"""Tick period once the step's prompts are all handed out (polls are cheap RPCs)."""


class DynamicScheduling:
    """The scheduler inside one GRPO job (`wf`: its ctl, cfg, groups, clock, progress
    and warm-start batches). Made by `start` once the groups are up; then, per step:
    before_rollout, after_rollout (the trainer group to train on), after_train (back
    home, the step's scheduling metrics); `busy(component)` around sections no move
    may interrupt (a train step, a weight sync)."""

    def __init__(self, wf: Any) -> None:
        self.wf, self.ctl, self.cfg = wf, wf.ctl, wf.cfg
        self.scheduler: GlobalScheduler | None = None
        self.home: dict[str, list[int]] = {}
        """The configured placement, restored at the end of every step."""
        self.inits: dict[str, dict] = {}
        self.standby: dict[str, StandbyPool] = {}
        self._ticking = False
        self._ticker: asyncio.Task | None = None
        self._failure: DynarlError | None = None
        """What stopped the ticker (a lost rank): the step raises it after the rollout."""
        self._expected = 0
        self._marks: dict[str, int] = {}
        self._begun = 0.0

    @classmethod
    async def start(cls, wf: Any, rollout: WorkerGroup, trainer: WorkerGroup,
                    devices: dict[str, list[int]]) -> "DynamicScheduling":
        self = cls(wf)
        await self._make_scheduler(rollout, trainer, devices)
        return self

    def busy(self, name: str) -> Any:
        """Held around a section of `name` that no move may interrupt."""
        return self.scheduler.managers[name].gate.busy()

    async def before_rollout(self, samples: int, label: str) -> None:
        """Every rollout rank admits prompts again (no donor yet), the trainer knows the
        step's batch (its remaining work), and the ticker starts."""
        for manager in self.scheduler.managers.values():
            manager.begin_cycle()
        self._expected = samples
        await self.wf.g.rollout.call("begin_step")
        await self._announce(self.wf.g.trainer)
        self._marks = {"decisions": len(self.scheduler.log.decisions),
                       "migrations": len(self.scheduler.log.migrations),
                       "counts": len(self.scheduler.log.counts)}
        self._begun = asyncio.get_running_loop().time()
        self._ticking = True
        self._ticker = self.ctl.spawn_task(self._tick_loop(), name=f"scheduler {label}")

    async def stop_ticking(self) -> None:
        """The ticker stops; a move in progress completes (or rolls back) first."""
        self._ticking = False
        if self._ticker is not None:
            ticker, self._ticker = self._ticker, None
            await ticker

    async def after_rollout(self) -> WorkerGroup:
        """Generation is over: one more decision where the train step has not begun
        (engines idle through the tail's end give their devices now). Returns the
        trainer group to train on (a P2P move replaced it)."""
        await self.stop_ticking()
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        await self._tick_once()
        return self.scheduler.group("trainer")

    async def after_train(self, label: str, rollout_stats: list[dict], rollout_s: float, samples: int,
                          train_s: float, train_devices: int, train_end: float, rollout_end: float) -> dict[str, Any]:
        """Back to the configured placement; the predictor learns from the step; returns
        the step's scheduling metrics."""
        await self._restore(label)
        metrics = self._scheduling_metrics(self._marks, train_end, rollout_end, label)
        self._profile(rollout_stats, rollout_s, samples, train_s, train_devices)
        return metrics

    async def _tick_loop(self) -> None:
        """The scheduler's ticker for one step (owned by the controller's TaskGroup):
        every `interval_s`, and every TAIL_TICK_S from the moment the last prompt
        (or END) has been handed out of the step's channel: the tail has begun, and
        on this job it can be shorter than one interval. The policy still decides."""
        interval = self.cfg.scheduler.dynarl.interval_s
        prompts, rollout = self.ctl.channel("prompts"), self.scheduler.managers["rollout"]
        waited = 0.0
        while self._ticking:
            await asyncio.sleep(min(TAIL_TICK_S, interval))
            waited += min(TAIL_TICK_S, interval)
            if not self._ticking:
                break
            in_tail = len(prompts) == 0 and rollout.active_requests > 0  # as of the last poll
            if waited >= interval or in_tail:
                waited = 0.0
                try:
                    await self._tick_once()
                except DynarlError as exc:
                    # A rank the scheduler polls or moves is lost. Raised here, it would
                    # take the controller's TaskGroup down mid-step; the step raises it
                    # once its rollout is over (after_rollout), and the run restarts.
                    self._failure, self._ticking = exc, False

    async def _tick_once(self) -> None:
        trainer = self.scheduler.group("trainer")
        try:
            await self.scheduler.tick()
        except MigrationFailed as exc:  # rolled back: the component goes on where it was
            self.wf.progress.note(f"scheduler: {exc}")
        moved = self.scheduler.group("trainer")
        if moved is not trainer:  # new ranks: they must know the batch they will train
            await self._announce(moved)

    async def _announce(self, trainer: WorkerGroup) -> None:
        """Each rank's share of the step's samples (the manager sums them)."""
        n, ranks = self._expected, trainer.world_size
        await trainer.scatter("expect", [[n // ranks + (r < n % ranks)] for r in range(ranks)])

    async def _restore(self, label: str) -> None:
        """Back to the configured placement before the next step's generation: the
        trainer P2P-reshards onto its own devices, rollout's parked engines rejoin
        (or, without them, new ones grow)."""
        sched, loop = self.scheduler, asyncio.get_running_loop()
        trainer_mgr, rollout = sched.managers["trainer"], sched.group("rollout")
        if sorted(trainer_mgr.group.devices) != self.home["trainer"]:
            async with trainer_mgr.gate.interrupt():
                begun = loop.time()
                old = trainer_mgr.group.devices
                trainer_mgr.group = (await p2p_migrate(self.ctl, trainer_mgr.group, self.home["trainer"],
                                                       self.inits["trainer"], standby=self.standby["trainer"])).group
                sched.record("p2p", "trainer", [d for d in old if d not in self.home["trainer"]], begun)
        missing = [d for d in self.home["rollout"] if d not in rollout.devices]
        if missing:
            async with sched.managers["rollout"].gate.interrupt():
                begun = loop.time()
                parked = self.standby["rollout"]
                if parked.has(missing):
                    parked.join(rollout, missing)
                    rollout.handles.sort(key=lambda h: h.spec.devices[0])
                    await rollout.call("workload_resume", ranks=[p for p, h in enumerate(rollout.handles)
                                                                 if h.spec.devices[0] in missing])
                    sched.record("join", "rollout", missing, begun)
                else:
                    await self.ctl.grow_group(rollout, missing, self.inits["rollout"])
                    sched.record("grow", "rollout", missing, begun)
        self.wf.g.trainer, self.wf.g.rollout = trainer_mgr.group, rollout  # (sync_weights rebuilds its group if need be)

    def _scheduling_metrics(self, marks: dict[str, int], train_end: float, rollout_end: float,
                            label: str) -> dict[str, Any]:
        """The step's migrations (count and seconds per kind:component; start of each
        relative to the rollout's end: negative = inside the tail), decisions and plans."""
        log = self.scheduler.log
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
        plans = [{"at_s": d.at, "at_vs_rollout_end_s": d.at - rollout_end, "moves": [list(x) for x in d.plan.moves],
                  "predicted_s": d.plan.predicted_time_s, "current_s": d.plan.current_time_s,
                  "migration_cost_s": d.plan.migration_cost_s, "measured_s": train_end - d.at,
                  "candidates": d.plan.candidates} for d in decisions if d.plan is not None]
        return {"migrations": count, "migration_s": seconds, "decisions": len(decisions),
                "migrations_in_tail": sum(1 for m in migrations if m.started < rollout_end),
                "devices": device_stats(log.counts, self._begun, end),
                "device_counts_vs_rollout_end_s": [[c.at - rollout_end, dict(c.counts)] for c in counts],
                "move_cost_s": {name: m.move_cost_s for name, m in self.scheduler.managers.items()},
                "trainer_model": {"profiled": [list(p) for p in self.scheduler.predictor.models["trainer"].points],
                                  "correction": self.scheduler.predictor.models["trainer"].correction},
                "migration_starts_vs_rollout_end_s": [[f"{m.kind}:{m.component}", m.started - rollout_end]
                                                      for m in migrations],
                "decision_ms_p50": ms[len(ms) // 2] if ms else 0.0,
                "decision_ms_p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else 0.0,
                "plans": plans}

    def _donor_spans(self, migrations: list, label: str) -> None:
        """The rollout stage's span is recorded on the devices it held at its end; the
        engines it released mid-step generated on theirs until the move: show that."""
        rollout = [s for s in self.wf.clock.spans if s.component == "rollout" and s.label == label]
        if not rollout:
            return
        start = min(s.start for s in rollout)
        for m in migrations:
            if m.kind == "workload" and m.component == "rollout" and m.started > start:
                # its own label: the stage's time (durations) is the rollout span's, not this
                self.wf.clock.spans.append(Span("rollout", list(m.devices), start, m.started, f"{label} released"))

    def _profile(self, rollout_stats: list[dict], rollout_s: float, samples: int, train_s: float,
                 train_devices: int) -> None:
        """The predictor's online part, from this step's measurements: rollout's rate
        at its configured devices; the trainer's measured rate corrects its profile
        (the profiled shape across device counts stays, its level follows the steps)."""
        tokens = sum(r["tokens"] for r in rollout_stats)
        models = self.scheduler.predictor.models
        if tokens and rollout_s > 0:
            models["rollout"] = ThroughputModel([(len(self.home["rollout"]), tokens / rollout_s)])
        if train_s > 0:
            models["trainer"].observe(train_devices, samples / train_s)

    async def _profile_trainer(self, batch: TrainBatch) -> None:
        """Profiled points at start: one step of a step-sized batch (`batch`) on warm
        standby ranks at every device count the trainer may come to hold (its own
        devices plus 0..all-but-one of rollout's; scheduler.dynarl.trainer_profile
        home: its own only, linear beyond), each on a throwaway model."""
        pool, home = self.standby["trainer"], self.home["trainer"]
        points = []
        every = self.cfg.scheduler.dynarl.trainer_profile == "every"
        for extra in range(len(self.home["rollout"]) if every else 1):
            devices = home + self.home["rollout"][:extra]
            group = pool.adopt(devices, f"trainer~profile{len(devices)}")
            dp = f"trainer_profile@{len(devices)}" if len(devices) > 1 else None
            try:
                if dp is not None:
                    await self.ctl.process_group(dp, [group])
                await group.call("start", dp)
                shards = [[batch.shard(r, group.world_size).to_wire()] for r in range(group.world_size)]
                begun = time.perf_counter()
                await group.scatter("train", shards)
                points.append((len(devices), len(batch.input_ids) / (time.perf_counter() - begun)))
            finally:
                if dp is not None:
                    await self.ctl.process_groups.destroy(dp)
                await group.call("reshard_retire")
                await pool.park(group)
        self.scheduler.predictor.models["trainer"] = ThroughputModel(points)

    async def _make_scheduler(self, rollout: WorkerGroup, trainer: WorkerGroup, devices: dict[str, list[int]]) -> None:
        """Rollout donates whole engines by Workload migration; the trainer receives
        them by P2P resharding (its remaining work: the step's samples). Inference is
        not a receiver: a rank grown mid-step would need the step's weights and a
        place in the running stage's END protocol; the trainer needs neither.
        Starts the warm standby trainer ranks (one per rollout device and per
        trainer device) before the first step, so no move waits for a spawn, and
        profiles the trainer on them."""
        d = self.cfg.scheduler.dynarl
        self.home = {"rollout": sorted(devices["rollout"]), "trainer": sorted(devices["trainer"])}
        # The exact constructor arguments the job's ranks were started with.
        self.inits = {"rollout": dict(rollout.handles[0].spec.init_kwargs),
                      "trainer": dict(trainer.handles[0].spec.init_kwargs)}
        self.standby = {"trainer": StandbyPool(self.ctl, trainer.cls, "trainer", self.inits["trainer"],
                                              warm="reshard_warm"),
                        "rollout": StandbyPool(self.ctl, rollout.cls, "rollout", self.inits["rollout"])}
        await self.standby["trainer"].fill(self.home["rollout"] + self.home["trainer"])
        # Rollout's rate: a placeholder until the first poll corrects it (online) and the
        # first step measures it (_profile); the trainer's: profiled below.
        predictor = Predictor({"rollout": ThroughputModel([(len(self.home["rollout"]), 1.0)]),
                               "trainer": ThroughputModel([(len(self.home["trainer"]), 1.0)])})
        self.scheduler = GlobalScheduler(self.ctl, "dynarl", predictor,
                                         DynarlConfig(d.theta, d.u_low, d.window_s, d.max_candidates,
                                                      d.charge_move_cost), d.interval_s)
        self.scheduler.register(ComponentSpec(
            "rollout", "dynamic", "workload", init=self.inits["rollout"], standby=self.standby["rollout"],
            requests_per_engine=self.cfg.rollout.engine.max_num_seqs), rollout)
        # The trainer steps on the whole batch: it works after generation, not beside it.
        self.scheduler.register(ComponentSpec("trainer", "static", "p2p", init=self.inits["trainer"],
                                              barrier=True, standby=self.standby["trainer"]), trainer)
        await self._profile_trainer(self._step_sized_batch())

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
