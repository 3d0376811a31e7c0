"""The `placement:`, `scheduler:` and `algorithm:` sections of `dynarl train`: where
the components run, whether devices move during a step, and how stale a sample may be."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from dynarl.components.model.spec import ModelSpec
from dynarl.components.trainer.base import Objective, RolloutCorrection, TrainerConfig
from dynarl.components.workflows.config_checks import whole_number

if TYPE_CHECKING:
    from dynarl.core.scheduler.policy import DynarlConfig


@dataclass(kw_only=True, slots=True)
class PlacementSection:
    mode: Literal["colocated", "spatial", "hybrid", "auto"] = "colocated"
    """colocated: all components time-share all devices; spatial: disjoint devices,
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


OWN_CLIP: dict[str, tuple[float | None, float | None]] = {
    "gspo": (3e-4, 4e-4),   # GSPO (arXiv 2507.18071): the sequence ratio's clip, its experiments'
    "dapo": (None, 0.28),   # DAPO (arXiv 2503.14476): clip-higher, eps_low 0.2 as PPO's
    "cispo": (1.0, None),   # MiniMax-M1 (arXiv 2506.13585): no lower bound on the IS weight
}
"""The objectives' own clip ranges (low, high) where their papers set one; None: trainer.engine's."""


@dataclass(kw_only=True, slots=True)
class AlgorithmSection:
    name: Objective = "grpo"
    """The RL objective (native trainer; trainer/advantages.py and trainer/native/objectives.py
    give each one's formulas and paper). grpo: advantages (r - mean) / std per group, PPO-clip,
    token-mean (arXiv 2402.03300). dr_grpo: advantages r - mean, the loss summed over tokens /
    (samples x rollout.max_new_tokens) (arXiv 2503.20783). gspo: one clipped ratio per
    sequence, mean over sequences (arXiv 2507.18071). dapo: clip-higher, token-mean, overlong
    reward shaping (arXiv 2503.14476). rloo: leave-one-out baseline r_i - mean of the others
    (arXiv 2402.14740). reinforce_pp: per-token returns with a KL penalty (weight
    trainer.engine.kl_coef), whitened over the batch (arXiv 2501.03262). cispo: REINFORCE
    weighted by the clipped importance weight, which carries no gradient (arXiv 2506.13585).
    opd: on-policy distillation from algorithm.teacher, per-token advantage teacher - student
    log-prob (the negative reverse KL, discount 0, no reward; arXiv 2306.13649), grpo's loss."""
    clip_eps_low: float | None = None
    """The ratio's clip below, in [0, 1] (gspo: the sequence ratio's; cispo: the IS weight's, 1
    = no lower bound). null: gspo 3e-4 and cispo 1 (their papers'), the others
    trainer.engine.clip_eps_low. Replaces trainer.engine.clip_eps_low."""
    clip_eps_high: float | None = None
    """The ratio's clip above. null: gspo 4e-4 and dapo 0.28 (their papers'), the others
    trainer.engine.clip_eps_high. Replaces trainer.engine.clip_eps_high."""
    overlong_buffer: int | None = None
    """dapo: the soft overlong penalty's L_cache, the last this many tokens before
    rollout.max_new_tokens, over which a response's reward falls linearly to -overlong_penalty
    (for its advantages; the reward metrics stay the verifier's). null: a fifth of
    rollout.max_new_tokens (the paper's 4096 of 20480) in workflow grpo, 0 in agentic; 0: off."""
    overlong_penalty: float = 1.0
    """dapo: the overlong penalty at rollout.max_new_tokens (the paper's 1)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (workflow grpo; arXiv 2503.14476 section 3.2): a prompt group
    whose samples' rewards are all equal (advantages 0: no gradient) is not trained; while
    the rollout runs, each one is replaced by the next prompt group, until the step has
    run.prompts_per_step groups whose rewards differ or max_refills more have been
    generated (then it trains those it has). Counted per step in metrics.jsonl:
    dynamic_dropped_groups, dynamic_refilled_groups, dynamic_short_groups; reward_mean is
    then every scored sample's mean reward, batch_reward_mean the trained batch's.
    components/workflows/refill.py."""
    max_refills: int | None = None
    """dynamic_sampling: the most prompt groups a step generates beyond
    run.prompts_per_step. null: twice run.prompts_per_step (a step generates at most
    three batches' worth)."""
    max_staleness: int = 0
    """How many policy versions behind the trainer a sample's generating weights may
    be. 0: on-policy (each step generates its batch, then trains on it). k >= 1: the
    rollout runs up to k steps ahead: while step s trains, the batches of the steps
    after it up to s + k not yet made are made on the weights of step s, so the
    rollout and the trainer work at once; the loss corrects for the older policy
    (decoupled PPO, trainer.engine.behav_weight_cap). Needs the rollout on devices of
    its own (placement spatial, or hybrid with rollout in a pool alone). With partial
    rollout (rollout.oversample > 1) steps do not overlap, and k >= 1 bounds how many
    versions behind a carried group's oldest token may be when it is trained: a
    group that would pass it is waited for, not started again."""
    rollout_correction: RolloutCorrection = "none"
    """Weigh each token's policy term by w = exp(old - rollout log-prob), the trainer's
    probability of the token over the rollout engine's (trainer/native/rollout_correction.py).
    none: no weight on-policy (with max_staleness > 0, decoupled PPO's, capped at
    trainer.engine.behav_weight_cap). tis: truncated, min(w, cap) (verl's rollout_is
    truncate, TRL's vllm_importance_sampling_correction token_truncate). mis: masked, tokens
    with w > cap leave the loss (verl's mask mode, TRL's token_mask). Per token, not per
    sequence. Needs rollout.temperature 1. The step's rollout_capped_frac counts the tokens
    the cap acted on; its `mismatch` metrics show the gap either way."""
    rollout_correction_cap: float = 2.0
    """tis and mis: the cap C on the weight, >= 1 (verl's rollout_is_threshold 2.0)."""
    teacher: ModelSpec | None = None
    """opd: the teacher, an HF folder (path, e.g. what `dynarl export` wrote from a trained
    run) or a built-in spec; its vocabulary and tokenizer must be the model's. The inference
    ranks hold it beside the policy and score every sample with it (teacher_logprobs)."""

    def __post_init__(self) -> None:
        whole_number(self, "max_staleness")
        if not self.rollout_correction_cap >= 1:
            raise ValueError(f"rollout_correction_cap must be >= 1, got {self.rollout_correction_cap}")
        if self.clip_eps_low is not None and not 0 <= self.clip_eps_low <= 1:
            raise ValueError(f"clip_eps_low must be in [0, 1], got {self.clip_eps_low}")
        if self.clip_eps_high is not None and self.clip_eps_high < 0:
            raise ValueError(f"clip_eps_high must be >= 0, got {self.clip_eps_high}")
        if self.overlong_buffer is not None:
            whole_number(self, "overlong_buffer")
        if self.overlong_penalty < 0:
            raise ValueError(f"overlong_penalty must be >= 0, got {self.overlong_penalty}")
        if self.max_refills is not None:
            whole_number(self, "max_refills")

    def refills(self, prompts_per_step: int) -> int:
        """dynamic_sampling's refill budget per step."""
        return 2 * prompts_per_step if self.max_refills is None else self.max_refills

    def trainer_engine(self, engine: TrainerConfig, max_new_tokens: int, workflow: str) -> TrainerConfig:
        """trainer.engine with this objective in it (TrainerConfig crosses to the trainer and
        the reward stages): the name, the clip range (this section's, else the objective's
        own, else the engine's), max_new_tokens as the objective's length and dapo's buffer,
        the rollout correction."""
        own_low, own_high = OWN_CLIP.get(self.name, (None, None))
        low = next(v for v in (self.clip_eps_low, own_low, engine.clip_eps_low) if v is not None)
        high = next(v for v in (self.clip_eps_high, own_high, engine.clip_eps_high) if v is not None)
        buffer = 0
        if self.name == "dapo":
            buffer = self.overlong_buffer if self.overlong_buffer is not None else \
                (max_new_tokens // 5 if workflow == "grpo" else 0)
        return dataclasses.replace(engine, objective=self.name, clip_eps_low=low, clip_eps_high=high,
                                   max_response_len=max_new_tokens, overlong_buffer=buffer,
                                   overlong_penalty=self.overlong_penalty, rollout_correction=self.rollout_correction,
                                   rollout_correction_cap=self.rollout_correction_cap)

