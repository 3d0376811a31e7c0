"""The `trainer:` and `critic:` sections of `dynarl train`: the policy's trainer
(with its supervised warm start) and, for workflow ppo, the critic."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.model.spec import ModelSpec
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
from dynarl.components.trainer.megatron.config import MegatronConfig


BUILT_IN_WARMUP_STEPS = 60
"""The built-in model's warm start: it starts from random weights, and RL needs a policy
that already answers in the task's format."""


@dataclass(kw_only=True, slots=True)
class WarmupSection:
    steps: int | None = None
    """Supervised steps on the task's reference answers before RL (0 = none), once, before
    step 0. Default (null): 60 for the built-in model (random weights), 0 with model.path
    (your model is not fine-tuned on the answers unless you ask for it)."""
    batch_size: int = 64
    """Samples per supervised step."""
    lr: float = 1e-3
    """Learning rate of the supervised steps."""

    def __post_init__(self) -> None:
        if (self.steps is not None and self.steps < 0) or self.batch_size < 1 or self.lr < 0:
            raise ValueError("warmup needs steps >= 0, batch_size >= 1, lr >= 0")

    def resolved_steps(self, model_path: str | None) -> int:
        """`steps`, or its default for the model: none for a model of your own."""
        if self.steps is not None:
            return self.steps
        return 0 if model_path else BUILT_IN_WARMUP_STEPS


@dataclass(kw_only=True, slots=True)
class TrainerSection:
    num_ranks: int = 1
    """Data-parallel ranks (the native trainer shards its state over them with FSDP2).
    One by default: on the 2-core CPU default one rank with both cores' threads
    (runtime.worker_threads null) trains as fast as two ranks of one thread each, in a
    process fewer (the main job 100 -> 86 s; the TRL job's tree 1.47 -> 1.05 GB PSS;
    docs/benchmarks.md "Against TRL"); on GPUs set it to the devices the trainer gets."""
    engine: TrainerConfig = field(default_factory=lambda: TrainerConfig(
        lr=3e-4, entropy_coef=0.02, micro_batch_size=64, grad_clip=1.0))
    """The policy's optimizer and loss. Its lr_step_offset is set to warmup.steps (a value given
    is replaced): the lr schedule counts the RL steps, after the warm start's."""
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
        # the trainer's steps before the first RL step (a copy: a config passed in stays as it is)
        # (TrainConfig resolves a default warmup.steps, which depends on the model, and sets it again)
        self.engine = dataclasses.replace(self.engine, lr_step_offset=self.warmup.steps or 0)
        if self.nonfinite == "skip" and self.backend == "megatron":
            raise ValueError("nonfinite skip needs the native trainer (megatron's optimizer applies a non-finite "
                             "update unless fp16 loss scaling catches it): use stop")



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

