"""What a step's stage ranks return (registered wire records, transport/wire.py
register_struct): a rollout rank's generate or serve_turns, a reward rank's score, an
inference rank's compute_logprobs, a streaming trainer rank's train_stream. The
workflow's StageStats (workflows/pipeline.py)
holds them; its metrics and the scheduler's rates read their fields. Their field
names are the keys a checkpoint's ahead.json keeps them under (workflows/overlap.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynarl.components.experience import Trained
from dynarl.components.inference.gap import LogprobGap
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.transport.wire import register_struct


@register_struct(60)
@dataclass(kw_only=True, slots=True)
class RolloutStats:
    """A rollout rank's step: generate fills the group fields, the agentic serve_turns
    the turn fields; the rest keep their defaults."""
    tokens: int = 0
    """Output tokens made here this step (those a migration moved away count here)."""
    engine_steps: int = 0
    busy: list[list[float]] = field(default_factory=list)
    """When the engine stepped: [start, end] intervals, loop time."""
    preemptions: int = 0
    reprefill_tokens: int = 0
    """Tokens of requests moved here without their KV, computed again."""
    devices: int = 1
    """Devices the engine spans (its tensor-parallel size)."""
    groups: int = 0
    groups_exported: int = 0
    groups_imported: int = 0
    kv_fetched: int = 0
    kv_lost: int = 0
    """Requests moved here whose KV came peer-to-peer, and whose KV could not be fetched."""
    turns: int = 0
    turns_exported: int = 0
    turns_imported: int = 0
    cached_tokens: int = 0
    """Prompt tokens of its turns the prefix cache served."""
    max_wait_s: float = 0.0
    """The longest a turn waited for admission (engine seconds)."""
    turn_kv_requests: int = 0
    turn_kv_tokens: int = 0
    turn_kv_s: float = 0.0
    turn_kv_reprefilled: int = 0
    """Follow-up turns whose last rank left with their context's KV: moved in (its
    tokens and engine seconds), or prefilled again."""


@register_struct(61)
@dataclass(kw_only=True, slots=True)
class RewardStats:
    """A reward rank's step, or the agentic workflow's reward stage (its episodes)."""
    verifier: str
    samples: int = 0
    episodes: dict[str, Any] = field(default_factory=dict)
    """The agentic workflow's: the step's episodes as its driver counted them
    (workflows/agentic.py driver_metrics)."""
    errors: int = 0
    timeouts: int = 0
    """reward.function: the samples whose call raised or returned no finite number, and
    those whose call timed out (components/reward/outcome.py Tally)."""
    first_error: str = ""
    """reward.function: the first failed call's sample and message."""
    scores: dict[str, list[float]] = field(default_factory=dict)
    """reward.function: each named score's [sum, count] over the samples that returned it."""


@register_struct(62)
@dataclass(kw_only=True, slots=True)
class InferenceStats:
    """An inference rank's step: samples scored, their sequence tokens, when it computed."""
    samples: int
    tokens: int
    busy: list[list[float]]
    """When its engine computed: [start, end] intervals, loop time."""
    rollout_gap: LogprobGap | None = None
    """Its samples' rollout log-probs against old_logprobs (inference/gap.py; None: not
    measured, emulated engines' log-probs are synthetic)."""
    teacher_gap: LogprobGap | None = None
    """old_logprobs against the teacher's (algorithm.name opd; None: no teacher)."""


@register_struct(66)
@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerStats:
    """A streaming trainer rank's step (train_stream): the step's metrics (equal on
    every rank), when it computed ([start, end] intervals, loop time), and what it
    trained (the ledger's ids and digests, the step metrics' inputs)."""
    metrics: TrainMetrics
    busy: list[list[float]]
    trained: Trained
