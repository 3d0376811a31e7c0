"""What one `dynarl sim` invocation runs: the workload's batches, engine settings, bounds.

Resolved once and shared by every policy, so all of them see the same requests.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynarl.components import costmodel as cm
from dynarl.components.inference.emulated import EmulatedInferenceConfig
from dynarl.components.placement.agentic import agentic_mode
from dynarl.components.placement.plan import COMPONENTS, Placement
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.tasks.source import TaskConfig
from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
from dynarl.components.trainer.emulated.layout import build_layout
from dynarl.components.workloads.catalog import get_workload, prompts_for
from dynarl.components.workloads.generate import generate
from dynarl.components.workloads.samples import Group
from dynarl.components.workloads.spec import Workload
from dynarl.components.workloads.trace import Trace, batch_of, load_trace
from dynarl.core.config import ClusterConfig, RuntimeConfig

from dynarl.launch.sim.bound import Bound, iteration_bound

if TYPE_CHECKING:
    from dynarl.components.workflows.config import TrainConfig


@dataclass(kw_only=True, slots=True)
class SimConfig:
    workload: str
    devices: int
    policies: tuple[str, ...] = ("colocated", "spatial")
    seed: int = 0
    iterations: int = 2
    """Iterations per policy; the first `warmup` are not measured."""
    warmup: int = 1
    prompts: int | None = None
    """Prompts per iteration; None: catalog.prompts_for (512 up to 256 devices, then 2 per device)."""
    trace: str | None = None
    device: str = "h100-80gb"
    time_scale: float = 1.0
    """Real seconds per emulated second (1 in virtual time; small on a real clock)."""
    launcher: str = "inproc"
    """inproc runs in virtual time; local runs real processes on the real clock (fidelity)."""
    micro_batches: int = 8
    """Pipeline depth the rlinf-auto planner assumes."""
    chunk_size: int = 1
    """Groups per channel item between stages (the elastic-pipelining granularity)."""
    failures: tuple["Failure", ...] = ()
    """Ranks lost during the run (`--fail`): each policy runs with them and without."""
    max_staleness: int | None = None
    """`--max-staleness`: algorithm.max_staleness of every asynchronous policy (staleness_of),
    in place of its own; None: each its own."""

    def __post_init__(self) -> None:
        if self.devices < 1:
            raise ValueError(f"devices must be >= 1, got {self.devices}")
        if not 0 <= self.warmup < self.iterations:
            raise ValueError(f"need 0 <= warmup < iterations, got warmup={self.warmup}, iterations={self.iterations}")
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"prompts must be >= 1, got {self.prompts}")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.launcher not in ("inproc", "local"):
            raise ValueError(f"launcher must be 'inproc' or 'local', got {self.launcher!r}")
        if self.launcher == "inproc" and self.time_scale != 1.0:
            raise ValueError("the inproc launcher runs in virtual time: time_scale must be 1")
        if self.max_staleness is not None and self.max_staleness < 1:
            raise ValueError(f"--max-staleness bounds the asynchronous policies: it must be >= 1, got "
                             f"{self.max_staleness}")
        if self.chunk_size < 1 or self.micro_batches < 1:
            raise ValueError("chunk_size and micro_batches must be >= 1")
        cm.get_device(self.device)


FAILING = ("rollout", "reward", "inference")
"""The components whose ranks a run survives losing in place (components/workflows/survival.py)."""


@dataclass(frozen=True, slots=True)
class Failure:
    """At `at_s` run seconds (emulated, since the run began) the component's first rank
    is lost (killed: its calls fail, its channel operations are refused)."""
    component: str
    at_s: float

    def __post_init__(self) -> None:
        if self.component not in FAILING:
            raise ValueError(f"--fail: a run survives losing a {', '.join(FAILING)} rank in place, not "
                             f"{self.component!r} (a trainer's loss restarts the job: no restart is simulated)")
        if not self.at_s >= 0:
            raise ValueError(f"--fail: the time must be >= 0 seconds, got {self.at_s}")

    @classmethod
    def parse(cls, text: str) -> "Failure":
        """"rollout@120": the component and the run second."""
        component, sep, at = text.partition("@")
        try:
            return cls(component.strip(), float(at)) if sep else cls(component.strip(), float("nan"))
        except ValueError as exc:
            raise ValueError(f"--fail takes COMPONENT@SECONDS (e.g. rollout@120), got {text!r}: {exc}") from None


@dataclass(slots=True)
class Scenario:
    config: SimConfig
    workload: Workload
    batches: list[list[Group]]
    bounds: list[Bound]
    weight_bytes: int
    trace: Trace | None = None
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_staleness: int = 0
    """The policy's algorithm.max_staleness (for_policy): 1 overlaps the next step's rollout."""
    oversample: float = 1.0
    """The policy's rollout.oversample (for_policy): > 1 is partial rollout."""
    kv_capacity: int = 0
    """KV tokens one rollout engine holds (no sample may need more)."""

    def batch(self, i: int) -> list[Group]:
        """Batch i of the prompt stream: the run's own, then more of the same workload (a
        partial rollout's extra prompts come from the batches after the run's)."""
        if i < len(self.batches):
            return self.batches[i]
        cfg = self.config
        prompts = len(self.batches[0])
        batch = batch_of(self.trace, i, prompts) if self.trace else generate(self.workload, cfg.seed, i, prompts)
        _check_fits([batch], self.kv_capacity, cfg.workload)
        return batch

    @property
    def num_devices(self) -> int:
        return self.config.devices

    @property
    def rollout_tp(self) -> int:
        return self.workload.rollout_tp

    def work(self) -> dict[str, float]:
        """Mean device-seconds per component per iteration (the split rule's input)."""
        return {c: sum(b.work_s[c] for b in self.bounds) / len(self.bounds) for c in self.bounds[0].work_s}


def build_scenario(config: SimConfig) -> "Scenario | Any":
    """The scenario of `config`'s workload (an embodied one: launch/sim/embodied.py)."""
    workload = get_workload(config.workload)
    if config.failures:
        _check_failing(config)
    if workload.kind == "embodied":
        from dynarl.launch.sim.embodied import build
        return build(config, workload)
    tp = workload.rollout_tp
    if config.devices % tp or config.devices < 3 * tp:
        raise ValueError(f"{config.workload} runs rollout at TP {tp}: devices must be a multiple of {tp} "
                         f"and at least {3 * tp} (one engine plus inference and trainer)")
    prompts = config.prompts or prompts_for(workload, config.devices)
    trace = load_trace(config.trace, workload) if config.trace else None
    batches = [batch_of(trace, i, prompts) if trace else generate(workload, config.seed, i, prompts)
               for i in range(config.iterations)]
    scale = config.time_scale
    engines = {
        # math: no prefix cache (single-turn, the prompt is ~3% of a group's KV) and lazy
        # outputs (only lengths are needed); agentic: the cache carries turns across calls.
        "rollout": {"model": workload.model, "device": config.device, "tp": tp, "time_scale": scale,
                    "enable_prefix_cache": workload.kind == "agentic", "lazy_outputs": True},
        "inference": {"model": workload.model, "device": config.device, "num_devices": 1, "time_scale": scale},
        "trainer": {"model": workload.model, "device": config.device, "time_scale": scale},
    }
    rollout_cfg = EmulatedRolloutConfig(**engines["rollout"])
    capacity = rollout_cfg.capacity_tokens()
    _check_fits(batches, capacity, config.workload)
    weight_bytes = build_layout(cm.get_model(workload.model), 1).total_numel * cm.BYTES_PER_PARAM
    bounds = [iteration_bound(b, model=workload.model, device=config.device, rollout_tp=tp,
                              max_num_seqs=rollout_cfg.max_num_seqs, num_devices=config.devices,
                              weight_bytes=weight_bytes, with_sync=i > 0,
                              critic=getattr(workload, "critic", False)) for i, b in enumerate(batches)]
    scn = Scenario(config, workload, batches, bounds, weight_bytes, trace, engines, kv_capacity=capacity)
    from dynarl.components.placement.policy import make_policy
    for name in config.policies:  # each policy's settings checked before any runs
        for_policy(scn, make_policy(name))
    return scn


def _check_failing(config: SimConfig) -> None:
    """--fail: every policy must survive a lost rank in place (components/workflows/
    survival.py: the static scheduler, whole on-policy steps)."""
    from dynarl.components.placement.policy import make_policy
    if config.launcher != "inproc":
        raise ValueError("--fail runs in virtual time only (not with --fidelity)")
    for name in config.policies:
        policy = make_policy(name)
        if policy.scheduler(config.devices) is not None or asynchronous(policy):
            raise ValueError(f"--fail: policy {name!r} moves devices or carries work across steps; a rank lost "
                             "there restarts the job from its checkpoint, which the simulator does not model "
                             "(choose static policies: colocated, spatial, hybrid, rlinf-auto)")


def asynchronous(policy: object) -> bool:
    """The policy trains samples made by older weights (overlapped steps or partial rollout)."""
    return getattr(policy, "max_staleness", 0) > 0 or getattr(policy, "oversample", 1.0) > 1.0


def staleness_of(policy: object, config: SimConfig) -> int:
    """algorithm.max_staleness as `policy` runs under `config`: --max-staleness for every
    asynchronous policy alike, else the policy's own."""
    if config.max_staleness is not None and asynchronous(policy):
        return config.max_staleness
    return int(getattr(policy, "max_staleness", 0))


def for_policy(scn: Scenario, policy: object) -> Scenario:
    """The scenario as `policy` runs it: whether a moved request takes its KV along
    (rollout.move_kv: dynarl-kv), and on agentic workloads its queue order and turn
    affinity (components/placement/agentic.py), in every rollout engine's settings, so
    engines started later (restores, re-plans) get them too."""
    rollout = dict(scn.engines["rollout"], move_kv=bool(getattr(policy, "move_kv", False)))
    if scn.workload.kind == "agentic":
        mode = agentic_mode(policy)
        rollout.update(queue=mode.queue, affinity=mode.affinity)
    staleness = staleness_of(policy, scn.config)
    oversample = float(getattr(policy, "oversample", 1.0))
    if staleness and oversample == 1.0 and scn.config.iterations < scn.config.warmup + 1 + staleness:
        raise ValueError(f"policy {getattr(policy, 'name', policy)!r} overlaps each step with the next "
                         f"{staleness} steps' rollout: it needs --iterations >= warmup + 1 + max_staleness "
                         f"({scn.config.warmup + 1 + staleness}), so that a measured step is neither the first "
                         "(nothing made ahead) nor one of the last (nothing to make)")
    return dataclasses.replace(scn, engines=dict(scn.engines, rollout=rollout), max_staleness=staleness,
                               oversample=oversample)


def _check_fits(batches: list[list[Group]], capacity: int, name: str) -> None:
    for batch in batches:
        for g in batch:
            for s in g.samples:
                need = s.sequence_tokens(g.prompt_tokens)
                if need > capacity:
                    raise ValueError(f"{name}: sample {s.sample_id} needs {need} KV tokens, more than one "
                                     f"engine's capacity of {capacity}")


def nic_or_link(shared_with_trainer: bool, device: str) -> float:
    """Weight-sync bandwidth: on the trainer's own devices (colocated) over NVLink, else one NIC."""
    spec = cm.get_device(device)
    return spec.link_bandwidth if shared_with_trainer else spec.nic_bandwidth


def output_cap(scn: Scenario) -> int | None:
    """The cap on a math request's output tokens (the workload's max_tokens); None for
    multi-turn, an uncapped distribution, or a trace (its lengths are its own)."""
    if scn.workload.kind != "math" or scn.trace is not None or math.isinf(scn.workload.response_tokens.cap):
        return None
    return int(scn.workload.response_tokens.cap)


def max_new_tokens(scn: Scenario, engine: EmulatedRolloutConfig) -> int:
    """rollout.max_new_tokens, the scheduler's cap on an output (its view of the tail):
    the workload's cap, else what one engine's KV holds (no request can be longer; the
    run's own lengths would be an oracle). (Each sample carries its own length to the
    emulated engine.)"""
    cap = output_cap(scn)
    return cap if cap is not None else engine.capacity_tokens()


def train_config(scn: Scenario, placement: Placement, scheduler: dict | None = None) -> "TrainConfig":
    """The `dynarl train` config this scenario runs under a policy's placement: emulated
    engines on emulated devices, the workload's batch, a streaming trainer (it starts
    on the first scored samples, as a trainer on devices of its own can; with a critic,
    workflow ppo, a trainer stepping on the whole batch after the critic's values), no warm
    start, rewards that cost nothing (verifier none) scored by one reward rank whatever
    the host's cores (reward.num_ranks null would follow them); `scheduler`: the
    `scheduler.dynarl` settings of an online policy (None: static)."""
    from dynarl.components.reward.config import RewardSection
    from dynarl.components.workflows.agentic_config import AgenticSection
    from dynarl.components.workflows.config import (AlgorithmSection, DynarlSection, InferenceSection,
                                                    PlacementSection,
                                                    RolloutSection, RunSection, SchedulerSection, TrainConfig,
                                                    TrainerSection, WarmupSection)
    cfg, engines = scn.config, scn.engines
    per_node = 8 if cfg.devices % 8 == 0 else cfg.devices
    rollout = dict(engines["rollout"], weight_sync_bandwidth=nic_or_link(
        placement.segment_of("rollout") == placement.segment_of("trainer"), cfg.device))
    affinity = rollout.pop("affinity", "none")  # multi-turn: the agentic workflow's routing
    move_kv = rollout.pop("move_kv", False)
    ranks = {c: placement.num_ranks(c) for c in COMPONENTS}
    ppo = getattr(scn.workload, "critic", False)  # (GAE needs whole samples' values: the trainer steps on the batch)
    pools = [list(s.components) for s in placement.segments] if placement.mode == "hybrid" else []
    return TrainConfig(
        runtime=RuntimeConfig(launcher=cfg.launcher, spawn_timeout_s=600.0, heartbeat_timeout_s=30.0,
                              cluster=ClusterConfig(num_nodes=cfg.devices // per_node, devices_per_node=per_node,
                                                    device_kind="emulated")),
        rollout=RolloutSection(num_ranks=ranks["rollout"], samples_per_prompt=len(scn.batches[0][0].samples),
                               chunk_size=cfg.chunk_size, backend="emulated", move_kv=move_kv,
                               oversample=scn.oversample,
                               max_new_tokens=max_new_tokens(scn, EmulatedRolloutConfig(**rollout)),
                               emulated=EmulatedRolloutConfig(**rollout)),
        inference=InferenceSection(num_ranks=ranks["inference"], backend="emulated",
                                   emulated=EmulatedInferenceConfig(**engines["inference"])),
        trainer=TrainerSection(num_ranks=ranks["trainer"], backend="emulated", streaming=not ppo,
                               emulated=EmulatedTrainerConfig(**engines["trainer"]), warmup=WarmupSection(steps=0)),
        placement=PlacementSection(mode=placement.mode, pools=pools),
        workflow="agentic" if scn.workload.kind == "agentic" else "ppo" if ppo else "grpo",
        agentic=AgenticSection(episodes="scripted", queue=rollout.get("queue", "fifo"), affinity=affinity,
                               max_bonus_s=EmulatedRolloutConfig(**rollout).priority_window_s),
        run=RunSection(steps=cfg.iterations, prompts_per_step=len(scn.batches[0]), seed=cfg.seed,
                       survive=bool(cfg.failures)),
        algorithm=AlgorithmSection(max_staleness=scn.max_staleness),
        scheduler=SchedulerSection() if scheduler is None else SchedulerSection(
            policy="dynarl", dynarl=DynarlSection(**scheduler)),
        task=TaskConfig(verifier="none"), reward=RewardSection(num_ranks=1))
