"""A step whose loss or gradient norm is not finite (`trainer.nonfinite`).

The native trainer leaves such a step's update out (trainer/native/trainer.py
`_update`): its weights and moments stay what the last finite step made them. The
workflow then either stops the run before the step's checkpoint and pruning (`stop`,
the default: the checkpoints on disk hold the last finite state, and `--resume`
continues from the newest), or counts the batch as skipped and goes on (`skip`: the
step's metrics row has `skipped_batches` 1, 0 otherwise).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from dynarl.transport.errors import DynarlError

WATCHED = ("loss", "grad_norm", "value_loss", "critic_grad_norm")
"""The step's metrics that must be finite (ppo adds its critic's)."""


class NonFiniteStep(DynarlError):
    """A step's loss or gradient norm is not finite, and trainer.nonfinite is stop."""


def not_finite(metrics: Mapping[str, Any], grad_norm_known: bool = True) -> list[str]:
    """'name value' of each watched metric that is not finite. `grad_norm_known`:
    False where the engine reports nan for a norm it did not compute (megatron
    without gradient clipping)."""
    watched = [n for n in WATCHED if grad_norm_known or not n.endswith("grad_norm")]
    return [f"{n} {metrics[n]}" for n in watched
            if isinstance(metrics.get(n), (int, float)) and not math.isfinite(metrics[n])]


def check(step: int, metrics: dict[str, Any], policy: str, grad_norm_known: bool = True) -> NonFiniteStep | None:
    """The error that ends the run where the step is not finite and `policy` is stop
    (raised once the step's metrics row is written, before its checkpoint), else None;
    with skip, the step's `skipped_batches` (0 or 1) goes into its metrics."""
    bad = not_finite(metrics, grad_norm_known)
    if policy == "skip":
        metrics["skipped_batches"] = int(bool(bad))
        return None
    if not bad:
        return None
    return NonFiniteStep(
        f"step {step} is not finite ({', '.join(bad)}): the run stopped before its checkpoint, so the checkpoints "
        "on disk hold the last finite state (trainer.nonfinite=skip goes on without such a batch)")
