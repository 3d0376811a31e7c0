"""What a trainer engine reports for one optimizer step (TrainerEngine.train_step and
apply): a typed record that crosses the wire as itself, its fields numbers
(transport/wire.py register_struct), from the trainer ranks to the controller."""
from __future__ import annotations

from dataclasses import dataclass

from dynarl.transport.wire import register_struct


@register_struct(32, numbers=True)
@dataclass(kw_only=True, slots=True)
class TrainMetrics:
    """Global over the data-parallel group, so equal on every rank (emulated: `tokens`
    is this rank's, the losses are 0)."""
    loss: float
    """The token-mean loss over the global batch (a critic's: its value loss)."""
    grad_norm: float
    """The global gradient norm before clipping (nan: megatron's optimizer gave none)."""
    tokens: int
    """Response tokens in the loss (mask 1)."""
    step: int
    """The engine's optimizer step count after this step."""
    pg_loss: float = 0.0
    kl: float = 0.0
    """The k3 KL estimate to the reference policy (0 without kl_coef)."""
    entropy: float = 0.0
    clip_frac: float = 0.0
    """Tokens whose policy ratio the PPO clip held."""
    rollout_capped_frac: float = 0.0
    """Tokens whose rollout-correction weight exp(old - rollout) the cap truncated (tis) or
    dropped (mis; decoupled PPO's behav_weight_cap): trainer/native/rollout_correction.py."""
    value_clip_frac: float = 0.0
    """A critic's: values the value clip held."""
    update_skipped: bool = False
    """megatron's optimizer skipped the update (a non-finite gradient)."""
    time_s: float = 0.0
    """Emulated: the step's cost-model seconds (0 on real engines)."""
