"""PPO over env steps: GAE with bootstrapping, and the clipped actor-critic update.

Pure torch functions on an iteration's rollout, [T, N] tensors (T steps of N envs):

    gae        advantages and returns; an episode that ended by termination has no
               future, one truncated (a time limit, a crashed env) continues from the
               value of its final observation, and the last step of the horizon from
               the value of the observation after it
    ppo_update `epochs` passes over shuffled minibatches: the clipped policy loss on
               minibatch-normalised advantages, the value loss, an entropy bonus, one
               global gradient-norm clip over actor and critic
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import torch
from torch import nn

from dynarl.components.embodied.policy import Actor, Critic
from dynarl.components.trainer.native.losses import explained_variance
from dynarl.transport.wire import register_struct


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminated: torch.Tensor,
        truncated: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, N] each: `values[t]` = V(s_t); `next_values[t]` = V of the observation after
    step t (the final one where step t truncated; unused where it terminated).

        delta_t = r_t + gamma * (1 - term_t) * next_values[t] - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}       done = term or trunc

    Returns (advantages, returns = A + V)."""
    advantages = torch.zeros_like(rewards)
    following = torch.zeros_like(rewards[0])
    for t in range(rewards.shape[0] - 1, -1, -1):
        done = (terminated[t] | truncated[t]).float()
        delta = rewards[t] + gamma * (1 - terminated[t].float()) * next_values[t] - values[t]
        following = delta + gamma * lam * (1 - done) * following
        advantages[t] = following
    return advantages, advantages + values


@dataclass(frozen=True, slots=True)
class Rollout:
    """An iteration's transitions, flattened over steps and envs."""
    obs: torch.Tensor          # [B, obs_dim]
    actions: torch.Tensor      # [B, action_dim] (Box) or [B] (Discrete)
    logprobs: torch.Tensor     # [B] under the policy that acted
    advantages: torch.Tensor   # [B]
    returns: torch.Tensor      # [B]
    values: torch.Tensor       # [B] the critic's before the update


@register_struct(64)
@dataclass(kw_only=True, slots=True)
class PPOMetrics:
    """An iteration's PPO update (LearnerWorker.train, a wire record): means over its
    minibatch updates. Its fields go into the step's metrics row (row)."""
    pg_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_frac: float
    explained_var: float | None
    """None where the returns did not vary."""
    updates: float
    action_std: float | None = None
    """A Box actor's mean standard deviation (None: a Discrete actor, left out of the row)."""

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        if self.action_std is None:
            del row["action_std"]
        return row


def ppo_update(actor: Actor, critic: Critic, optimizer: torch.optim.Optimizer, data: Rollout, *, epochs: int,
               minibatches: int, clip_eps: float, value_coef: float, entropy_coef: float, max_grad_norm: float,
               generator: torch.Generator, average: Callable[[list[torch.Tensor]], None] | None = None
               ) -> PPOMetrics:
    """`average`: data-parallel ranks average their gradients with it before the clip
    (each rank updates on its own part; every rank makes the same number of updates:
    `minibatches` per epoch)."""
    n = data.obs.shape[0]
    size = max(1, n // minibatches)
    sums = {"pg_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_frac": 0.0}
    updates = 0
    params = [*actor.parameters(), *critic.parameters()]
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, min(n - size + 1, minibatches * size), size):
            idx = order[start:start + size]
            dist = actor.distribution(data.obs[idx])
            logp = actor.log_prob(dist, data.actions[idx])
            ratio = (logp - data.logprobs[idx]).exp()
            adv = data.advantages[idx]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8) if adv.numel() > 1 else adv
            pg = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv).mean()
            v_loss = 0.5 * (critic(data.obs[idx]) - data.returns[idx]).pow(2).mean()
            entropy = actor.entropy(dist).mean()
            loss = pg + value_coef * v_loss - entropy_coef * entropy
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if average is not None:
                average([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
            nn.utils.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                log_ratio = logp - data.logprobs[idx]
                sums["pg_loss"] += float(pg)
                sums["value_loss"] += float(v_loss)
                sums["entropy"] += float(entropy)
                sums["approx_kl"] += float(((ratio - 1) - log_ratio).mean())
                sums["clip_frac"] += float(((ratio - 1).abs() > clip_eps).float().mean())
            updates += 1
    return PPOMetrics(**{k: v / max(updates, 1) for k, v in sums.items()},
                      explained_var=explained_variance(data.values, data.returns), updates=float(updates))
