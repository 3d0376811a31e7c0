"""The embodied policy: a small actor and a critic, tanh MLPs on the observation.

    Actor    obs -> 2 x hidden -> action mean (Box, with a learned state-independent
             log std) or logits (Discrete)
    Critic   obs -> 2 x hidden -> V(obs)

`distribution` gives the action distribution; log-probs of a Box action sum over its
dimensions. The sampled action is what is trained on; the env steps it clipped to
the action space's bounds (`clip`), as PPO implementations for MuJoCo do.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from dynarl.components.embodied.spaces import EnvSpec


def mlp(inputs: int, hidden: int, outputs: int, out_gain: float) -> nn.Sequential:
    """Orthogonal init (gain sqrt 2 inside, `out_gain` at the output), zero biases."""
    net = nn.Sequential(nn.Linear(inputs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                        nn.Linear(hidden, outputs))
    for layer in net:
        if isinstance(layer, nn.Linear):
            nn.init.orthogonal_(layer.weight, math.sqrt(2) if layer is not net[-1] else out_gain)
            nn.init.zeros_(layer.bias)
    return net


class Actor(nn.Module):
    def __init__(self, spec: EnvSpec, hidden: int) -> None:
        super().__init__()
        self.spec = spec
        self.net = mlp(spec.obs_dim, hidden, spec.action_dim, 0.01)
        self.log_std = nn.Parameter(torch.zeros(spec.action_dim)) if not spec.discrete else None

    def distribution(self, obs: torch.Tensor) -> torch.distributions.Distribution:
        out = self.net(obs)
        if self.spec.discrete:
            return torch.distributions.Categorical(logits=out)
        return torch.distributions.Normal(out, self.log_std.exp().expand_as(out))

    def log_prob(self, dist: torch.distributions.Distribution, actions: torch.Tensor) -> torch.Tensor:
        lp = dist.log_prob(actions)
        return lp if self.spec.discrete else lp.sum(-1)

    def entropy(self, dist: torch.distributions.Distribution) -> torch.Tensor:
        e = dist.entropy()
        return e if self.spec.discrete else e.sum(-1)


class Critic(nn.Module):
    def __init__(self, spec: EnvSpec, hidden: int) -> None:
        super().__init__()
        self.net = mlp(spec.obs_dim, hidden, 1, 1.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)


def clip(spec: EnvSpec, actions: torch.Tensor) -> list:
    """What the env steps: a Discrete action as an int, a Box action within its bounds."""
    if spec.discrete:
        return [int(a) for a in actions]
    low, high = torch.tensor(spec.low), torch.tensor(spec.high)
    return torch.minimum(torch.maximum(actions, low), high).tolist()
