"""The DynaRL wiring of the GRPO job (scheduler.policy=dynarl), as a mixin of GRPO.

Per step: a ticker (owned by the controller's TaskGroup) lets the GlobalScheduler
move idle rollout engines to the trainer (Workload out of rollout, P2P into the
trainer); non-interruptible sections hold their component's gate; after the
train step the configured placement is restored, and the step's migrations,
decision times and plans (predicted vs measured) go into its metrics.
"""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from dynarl.components.workflows.stages import Span
from dynarl.core.config_tree import to_dict
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.scheduler.loop import GlobalScheduler
from dynarl.core.scheduler.manager import ComponentSpec
from dynarl.core.scheduler.policy import DynarlConfig
from dynarl.core.scheduler.predictor import Predictor, ThroughputModel
from dynarl.core.worker_group import WorkerGroup


class DynamicScheduling:
    """Mixed into GRPO: uses its ctl, cfg, g, clock and progress."""

    scheduler: GlobalScheduler | None = None

    def _busy(self, name: str) -> Any:
        if self.scheduler is None:
            return contextlib.nullcontext()
        return self.scheduler.managers[name].gate.busy()

    def _begin_scheduling(self) -> dict[str, int]:
        for manager in self.scheduler.managers.values():
            manager.low_since.clear()  # idle time of the previous step is not this step's tail
        self._ticking = True
        return {"decisions": len(self.scheduler.log.decisions), "migrations": len(self.scheduler.log.migrations)}

    async def _tick_loop(self) -> None:
        """The scheduler's ticker for one step (owned by the controller's TaskGroup)."""
        interval = self.cfg.scheduler.dynarl.interval_s
        while self._ticking:
            await asyncio.sleep(interval)
            if not self._ticking:
                break
            await self._tick_once()

    async def _tick_once(self) -> None:
        try:
            await self.scheduler.tick()
        except MigrationFailed as exc:  # rolled back: the component goes on where it was
            self.progress.note(f"scheduler: {exc}")

    async def _restore(self, label: str) -> None:
        """Back to the configured placement before the next step's generation: the
        trainer P2P-reshards onto its own devices, rollout grows onto the freed ones,
        and the weight-sync group is rebuilt over the new ranks."""
        sched, loop = self.scheduler, asyncio.get_running_loop()
        trainer_mgr, rollout = sched.managers["trainer"], sched.group("rollout")
        moved = False
        if sorted(trainer_mgr.group.devices) != self.home["trainer"]:
            async with trainer_mgr.gate.interrupt():
                begun = loop.time()
                old = trainer_mgr.group.devices
                trainer_mgr.group = (await p2p_migrate(self.ctl, trainer_mgr.group, self.home["trainer"],
                                                       self.inits["trainer"])).group
                sched._record("p2p", "trainer", [d for d in old if d not in self.home["trainer"]], begun)
            moved = True
        missing = [d for d in self.home["rollout"] if d not in rollout.devices]
        if missing:
            async with sched.managers["rollout"].gate.interrupt():
                begun = loop.time()
                await self.ctl.grow_group(rollout, missing, self.inits["rollout"])
                sched._record("grow", "rollout", missing, begun)
            moved = True
        self.g.trainer, self.g.rollout = trainer_mgr.group, rollout
        if moved or self.ctl.process_groups.active.get("weight_sync") is None:
            await self.ctl.process_group("weight_sync", [(self.g.trainer, 0), self.g.rollout, self.g.inference])

    def _scheduling_metrics(self, marks: dict[str, int], train_end: float, label: str) -> dict[str, Any]:
        log = self.scheduler.log
        decisions = log.decisions[marks["decisions"]:]
        migrations = log.migrations[marks["migrations"]:]
        count: dict[str, int] = {}
        seconds: dict[str, float] = {}
        for m in migrations:
            key = f"{m.kind}:{m.component}"
            count[key] = count.get(key, 0) + 1
            seconds[key] = seconds.get(key, 0.0) + m.seconds
            self.clock.spans.append(Span(f"migrate {m.kind}", list(m.devices), m.started, m.started + m.seconds,
                                         label))
            self.ctl.tracer.complete(f"{m.kind} {m.component} {label}", "migration", "devices", 0,
                                     m.started, m.started + m.seconds, {"devices": list(m.devices)})
        ms = sorted(d.ms for d in decisions)
        plans = [{"at_s": d.at, "moves": [list(x) for x in d.plan.moves], "predicted_s": d.plan.predicted_time_s,
                  "current_s": d.plan.current_time_s, "measured_s": train_end - d.at,
                  "candidates": d.plan.candidates} for d in decisions if d.plan is not None]
        return {"migrations": count, "migration_s": seconds, "decisions": len(decisions),
                "decision_ms_p50": ms[len(ms) // 2] if ms else 0.0,
                "decision_ms_p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else 0.0,
                "plans": plans}

    def _profile(self, rollout_stats: list[dict], rollout_s: float, samples: int, train_s: float,
                 train_devices: int) -> None:
        """The predictor's profile, from this step's measurements at the configured
        placement (the policy then scales it linearly per device)."""
        tokens = sum(r["tokens"] for r in rollout_stats)
        models = self.scheduler.predictor.models
        if tokens and rollout_s > 0:
            models["rollout"] = ThroughputModel([(len(self.home["rollout"]), tokens / rollout_s)])
        if train_s > 0:
            models["trainer"] = ThroughputModel([(train_devices, samples / train_s)])

    def _profile_trainer(self, samples_per_s: float) -> None:
        """The trainer's first profile point, from the warm start's last step."""
        self.scheduler.predictor.models["trainer"] = ThroughputModel([(len(self.home["trainer"]), samples_per_s)])

    def _make_scheduler(self, rollout: WorkerGroup, trainer: WorkerGroup, devices: dict[str, list[int]],
                        model: dict, bucket: int, shared: set[str]) -> None:
        """Rollout donates whole engines by Workload migration; the trainer receives
        them by P2P resharding (its remaining work: the step's samples). Inference is
        not a receiver: a rank grown mid-step would need the step's weights and a
        place in the running stage's END protocol; the trainer needs neither."""
        d, cfg = self.cfg.scheduler.dynarl, self.cfg
        self.home = {"rollout": sorted(devices["rollout"]), "trainer": sorted(devices["trainer"])}
        self.inits = {
            "rollout": {"model": model, "engine": _plain(cfg.rollout.engine), "bucket_bytes": bucket,
                        "shares_device": "rollout" in shared},
            "trainer": {"model": model, "engine": cfg.trainer.engine.to_wire(), "warmup_lr": cfg.trainer.warmup.lr,
                        "bucket_bytes": bucket, "shares_device": "trainer" in shared}}
        # Placeholder rates until the warm start / first step measure them (_profile, online correction).
        predictor = Predictor({"rollout": ThroughputModel([(len(self.home["rollout"]), 1.0)]),
                               "trainer": ThroughputModel([(len(self.home["trainer"]), 1.0)])})
        self.scheduler = GlobalScheduler(self.ctl, "dynarl", predictor,
                                         DynarlConfig(d.theta, d.u_low, d.window_s, d.max_candidates), d.interval_s)
        self.scheduler.register(ComponentSpec("rollout", "dynamic", "workload", init=self.inits["rollout"]), rollout)
        self.scheduler.register(ComponentSpec("trainer", "static", "p2p", init=self.inits["trainer"]), trainer)


def _plain(obj: Any) -> dict[str, Any]:
    return to_dict(obj)
