"""The `dynarl train` configuration: one validated dataclass tree.

    runtime    the runtime (launcher, cluster devices, worker threads)
    model      which model (built-in tiny config or an HF folder)
    task       built-in count-up task or a JSONL/Parquet dataset; the verifier
    rollout    ranks, samples per prompt, sampling, chunk size, engine, backend   rollout_config.py
    inference  ranks, micro-batch                                                 rollout_config.py
    trainer    ranks, GRPO/optimizer settings (engine), warm start, weight-sync   trainer_config.py
               buckets, backend; critic: workflow ppo's critic and GAE
    placement  colocated | spatial | hybrid | auto (+ pools)                      scheduler_config.py
    scheduler  static | dynarl; algorithm: the objective (name), max_staleness    scheduler_config.py
    run        steps, prompts per step, seed, checkpoints                         run_config.py
    agentic, embodied, memory: agentic_config.py, embodied_config.py, memory/config.py
    judge      an LLM judge's model, devices, engine, prompt and score          reward/judge_config.py
    reward     a reward function in place of the task's verifier                   reward/config.py

Load with `load_config` (defaults <- YAML <- key=value overrides): every error
names its field path. Checks that need the whole tree (placement fits the
cluster, batch fits the ranks) run in TrainConfig.__post_init__ (config_checks.py);
checks that need I/O (the dataset file) run in the launcher before any worker starts.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from dynarl.components.memory.config import MemorySection
from dynarl.components.model.spec import ModelSpec
from dynarl.components.reward.config import RewardSection, check_reward
from dynarl.components.placement.plan import COMPONENTS, Placement, PlacementError, from_pools
from dynarl.components.reward.judge_config import JudgeSection
from dynarl.components.tasks.source import TaskConfig
from dynarl.components.agents.config import AgentSection
from dynarl.components.workflows.agentic_config import AgenticSection
from dynarl.components.workflows.config_checks import check
from dynarl.components.workflows.embodied_config import EmbodiedSection
from dynarl.components.workflows.judge_checks import check_judge
from dynarl.components.workflows.rollout_config import InferenceSection, RolloutSection
from dynarl.components.workflows.run_config import LOGGERS, RunSection
from dynarl.components.workflows.scheduler_config import (AlgorithmSection, DynarlSection, PlacementSection,
                                                          SchedulerSection)
from dynarl.components.workflows.trainer_config import CriticSection, TrainerSection, WarmupSection
from dynarl.core.config import RuntimeConfig
from dynarl.core.config_tree import apply_override, build, to_dict
from dynarl.transport.errors import ConfigError

__all__ = ["AlgorithmSection", "CriticSection", "DynarlSection", "InferenceSection", "LOGGERS", "PlacementSection",
           "RolloutSection", "RunSection", "SchedulerSection", "TrainConfig", "TrainerSection", "WarmupSection",
           "load_config", "to_dict"]


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    runtime: RuntimeConfig = field(default_factory=lambda: RuntimeConfig(launcher="local", worker_threads=None))
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
    agent: AgentSection = field(default_factory=AgentSection)
    """agentic.episodes agent: the OpenAI-API agent that plays each episode."""
    critic: CriticSection = field(default_factory=CriticSection)
    embodied: EmbodiedSection = field(default_factory=EmbodiedSection)
    memory: MemorySection = field(default_factory=MemorySection)
    """The memory plan `dynarl train` prints with --dry-run and checks before start (docs/memory.md)."""
    judge: JudgeSection = field(default_factory=JudgeSection)
    """An LLM judge that scores each sample after the reward stage, on devices of its own
    or time-shared (components/workflows/judge_stage.py)."""
    reward: RewardSection = field(default_factory=RewardSection)
    """A reward function of the user's in place of the task's verifier (docs/reward.md)."""

    def __post_init__(self) -> None:
        # the warm start's default depends on the model: none for model.path (WarmupSection)
        t = self.trainer
        t.warmup.steps = t.warmup.resolved_steps(self.model.path)
        t.engine = dataclasses.replace(t.engine, lr_step_offset=t.warmup.steps)
        check(self)
        check_judge(self)
        check_reward(self)
        # the objective goes to the trainer (and the reward stages) in trainer.engine
        self.trainer.engine = self.algorithm.trainer_engine(self.trainer.engine, self.rollout.max_new_tokens,
                                                            self.workflow)

    def ranks(self) -> dict[str, int]:
        return {"rollout": self.rollout.num_ranks, "inference": self.inference.num_ranks,
                "trainer": self.trainer.num_ranks}

    def placement_plan(self) -> Placement:
        """The placement of `placement.mode` (components/placement/plan.py); auto has
        none until the job has profiled its components (job.py Job.run)."""
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
    merged["trainer"]["warmup"]["steps"] = None  # its default depends on the model (WarmupSection)
    merged["rollout"]["oversample"] = None  # its default depends on the scheduler (default_oversample)
    if data is not None:
        if not isinstance(data, dict):
            raise ConfigError("", f"a config file must hold a mapping, got {type(data).__name__}")
        _merge(merged, data, "")
    for key, value in overrides:
        apply_override(merged, key, value)
    if isinstance(merged.get("rollout"), dict) and merged["rollout"].get("oversample") is None:
        merged["rollout"]["oversample"] = default_oversample(merged)
    placement = merged.get("placement")
    if isinstance(placement, dict) and placement.get("mode") == "temporal":
        raise ConfigError("placement.mode", "'temporal' is now called 'colocated': set placement.mode colocated")
    return build(TrainConfig, merged)


def default_oversample(merged: dict[str, Any]) -> float:
    """rollout.oversample where the config leaves it out: 1.5 under the dynarl scheduler
    with algorithm.max_staleness >= 1 (its asynchronous steps are partial rollout: the
    tail is carried into the next steps while its devices go to the trainer), else 1
    (off). Reads the merged mapping before validation: a value of the wrong type is
    left to the fields' own checks."""
    scheduler, algorithm = merged.get("scheduler"), merged.get("algorithm")
    policy = scheduler.get("policy") if isinstance(scheduler, dict) else None
    k = algorithm.get("max_staleness") if isinstance(algorithm, dict) else None
    asynchronous = isinstance(k, int) and not isinstance(k, bool) and k >= 1
    return 1.5 if policy == "dynarl" and asynchronous else 1.0


def _merge(base: dict, update: dict, path: str) -> None:
    for key, value in update.items():
        where = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value, where)
        else:
            base[key] = value
