"""`dynarl sim --workload embodied`: the embodied workflow of `dynarl train`
(components/workflows/embodied.py) on emulated workers in virtual time, one run per
policy on the policy's placement (components/placement/embodied.py).

    spawn  -> env workers, policy and learner ranks on the placement (embodied.backend
              emulated: env steps cost the measured step time, acts and training the
              cost model's, components/embodied/emulated.py)
    repeat -> Embodied.step: every chunk acts and steps `acts` times, the learner trains
              on its part of the envs, the weights go to the policy

Figures per policy, over the measured iterations: iteration time, env steps per
second, the devices' idle share (1 - device-seconds spent stepping, acting or training
/ (N x time)), the planner's predicted time, and the lower bound
max(work / N, the critical path: one env's acts and steps in a row, then its share of
training on every device).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import dynarl
from dynarl.components import costmodel as cm
from dynarl.components.placement.embodied import POLICIES, EmbodiedCosts, EmbodiedPlacement, place_policy, predict
from dynarl.components.workflows.embodied_config import EmulatedEmbodiedConfig
from dynarl.components.workloads.spec import EmbodiedWorkload
from dynarl.core.controller import Controller

from dynarl.launch.sim.metrics import add_speedups, measured_window
from dynarl.launch.sim.records import Quiet


@dataclass(frozen=True, slots=True)
class EmbodiedScenario:
    config: Any
    """The SimConfig."""
    workload: EmbodiedWorkload
    emulated: EmulatedEmbodiedConfig
    costs: EmbodiedCosts

    @property
    def bound_s(self) -> float:
        c, n = self.costs, self.config.devices
        path = c.acts * (c.env_s + c.act_s) + c.train_s / c.envs / n
        return max(sum(c.work().values()) / n, path)


def build(config: Any, workload: EmbodiedWorkload) -> EmbodiedScenario:
    if config.launcher != "inproc":
        raise ValueError("the embodied workload simulates in virtual time only (no --fidelity)")
    for name in config.policies:
        if name not in POLICIES:
            raise ValueError(f"the embodied workload runs policies {', '.join(POLICIES)}, not {name!r}")
    w = workload
    emulated = EmulatedEmbodiedConfig(model=w.model, device=config.device, env_step_s=w.env_step_s,
                                      action_chunk=w.action_chunk, obs_tokens=w.obs_tokens,
                                      action_tokens=w.action_tokens)
    envs = w.envs_per_device * config.devices
    from dynarl.components.engine_costs import emulated_trainer_min_devices
    costs = EmbodiedCosts(envs=envs, acts=w.acts, env_s=emulated.env_s(1), act_s=emulated.act_s(1),
                          train_s=emulated.train_s(envs * w.acts, 1), switch_s=cm.ROLE_SWITCH_S,
                          learner_min=emulated_trainer_min_devices(emulated.learner()))
    return EmbodiedScenario(config, w, emulated, costs)


def train_config(scn: EmbodiedScenario, placement: EmbodiedPlacement, policy: str = "static") -> Any:
    """The `dynarl train` config of the embodied job on `placement`: emulated workers on
    emulated devices, the inproc launcher; policy dynarl: the scheduler's barrier rule,
    moves priced as the LLM workloads' dynarl prices them (components/placement/dynarl.py)."""
    from dynarl.components.placement.dynarl import DEFAULT_CONFIG
    from dynarl.components.workflows.config import (DynarlSection, PlacementSection, RunSection, SchedulerSection,
                                                    TrainConfig)
    from dynarl.components.workflows.embodied_config import EmbodiedSection
    from dynarl.core.config import ClusterConfig, RuntimeConfig
    cfg = scn.config
    per_node = 8 if cfg.devices % 8 == 0 else cfg.devices
    return TrainConfig(
        runtime=RuntimeConfig(launcher="inproc", spawn_timeout_s=600.0, heartbeat_timeout_s=30.0,
                              cluster=ClusterConfig(num_nodes=cfg.devices // per_node, devices_per_node=per_node,
                                                    device_kind="emulated")),
        workflow="embodied", placement=PlacementSection(mode=placement.mode),
        embodied=EmbodiedSection(env_id=scn.workload.env_id, env_workers=len(placement.env),
                                 envs_per_worker=max(placement.envs), horizon=scn.workload.acts,
                                 backend="emulated", emulated=scn.emulated),
        scheduler=SchedulerSection(policy="dynarl" if policy == "dynarl" else "static",
                                   dynarl=DynarlSection(charge_move_cost=DEFAULT_CONFIG.charge_move_cost)),
        run=RunSection(steps=cfg.iterations, seed=cfg.seed))


def run_policy(scn: EmbodiedScenario, name: str) -> dict[str, Any]:
    """One policy's run; its figures (before speedups)."""
    from dynarl.components.workflows.embodied import Embodied
    cfg, c = scn.config, scn.costs
    placement = place_policy(name, cfg.devices, c)
    config = train_config(scn, placement, name)
    iterations: list[dict[str, float]] = []

    async def workflow(ctl: Controller) -> None:
        loop = asyncio.get_running_loop()
        wf = Embodied(ctl, config, None, None, None, Quiet(), placement=placement)
        await wf.spawn()
        await wf.sync_weights(0, "start")
        previous = loop.time()
        for it in range(cfg.iterations):
            metrics = await wf.step(it)
            end = loop.time()
            train_busy = metrics["time_s"] * metrics["learner_ranks"]  # (each rank its equal part)
            iterations.append({"time_s": end - previous, "env_steps": metrics["env_steps"] * scn.workload.action_chunk,
                               "busy_device_s": metrics["env_busy_s"] + metrics["act_busy_s"] + train_busy,
                               "rollout_s": metrics["rollout_s"], "trainer_s": metrics["trainer_s"],
                               "sync_s": metrics["sync_s"], "moves": metrics["barrier_moves"]})
            previous = end
        for group in wf.worker_groups():
            await ctl.stop_group(group)

    dynarl.run(workflow, config.runtime, virtual_time=True)
    measured = iterations[measured_window(cfg)]
    n, total = len(measured), sum(r["time_s"] for r in measured)
    iter_time = total / n
    return {
        "iter_time_s": iter_time,
        "env_steps_per_s": sum(r["env_steps"] for r in measured) / total,
        "gpu_idle_frac": 1.0 - sum(r["busy_device_s"] for r in measured) / (cfg.devices * total),
        "bound_s": scn.bound_s, "ratio_to_bound": iter_time / scn.bound_s,
        "predicted_s": None if name == "dynarl" else predict(placement, c),  # (the learner's devices change)
        "stage_s": {k: sum(r[k] for r in measured) / n for k in ("rollout_s", "trainer_s", "sync_s")},
        "placement": {"segments": placement.describe(), "env": len(placement.env),
                      "rollout": len(placement.rollout), "trainer": len(placement.trainer)},
        "decision_ms_p99": 0.0, "replans": [],
        "moves_per_iteration": sum(r["moves"] for r in measured) / n,
    }


def simulate(scn: EmbodiedScenario, *, log: Any = None, jobs: int = 1) -> dict[str, Any]:
    """Every policy of the scenario, `jobs` at a time (the same output either way)."""
    import time

    from dynarl.launch.sim.parallel import run_all
    cfg = scn.config

    def task(name: str):
        def run() -> dict[str, Any]:
            started = time.perf_counter()
            return {"metrics": run_policy(scn, name), "wall_s": time.perf_counter() - started}
        return run

    def done(i: int, out: dict[str, Any]) -> None:
        if log is not None:
            print(f"dynarl sim: {cfg.policies[i]} done in {out['wall_s']:.1f} s wall", file=log)

    outs = run_all([task(name) for name in cfg.policies], jobs, on_done=done)
    policies = {name: out["metrics"] for name, out in zip(cfg.policies, outs)}
    add_speedups(policies)
    w, c = scn.workload, scn.costs
    return {"workload": cfg.workload, "kind": w.kind, "devices": cfg.devices, "seed": cfg.seed,
            "device": cfg.device, "prompts": c.envs, "envs": c.envs, "iterations": cfg.iterations,
            "measured_iterations": len(range(cfg.iterations)[measured_window(cfg)]),
            "work_s": c.work(), "policies": policies}
