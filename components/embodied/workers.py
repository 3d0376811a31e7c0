"""The embodied workflow's model workers: the policy that acts (rollout) and the
learner that trains actor and critic (trainer).

PolicyWorker holds the actor only; `act` samples one action per observation with a
seed the workflow gives (so actions do not depend on which env chunk came first) and
returns the sampled actions, their log-probs and what the envs step (clipped). It
receives the learner's actor weights over the runtime's weight sync (weight_sync.py,
as the LLM engines do).

LearnerWorker holds actor, critic and one Adam over both; `train` takes an
iteration's Trajectory, computes values and GAE (learn.gae), runs PPO (learn.
ppo_update) and returns the update's figures. Its checkpoint is one file of
tensors (actor, critic, Adam's state, RNG) in safetensors.
"""
from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import safetensors
import safetensors.torch
import torch

import dynarl
from dynarl.components import weight_sync
from dynarl.components.embodied.learn import PPOMetrics, Rollout, gae, ppo_update
from dynarl.components.embodied.policy import Actor, Critic, clip
from dynarl.components.embodied.spaces import EnvSpec
from dynarl.components.workflows.checkpoints import LEARNER_FILE
from dynarl.components.workflows.embodied_config import EmbodiedSection
from dynarl.core.files import atomic_open
from dynarl.transport.wire import register_struct

BUCKET_BYTES = 1 << 20
CHECKPOINT_FILE = LEARNER_FILE


@register_struct(18)
@dataclass(slots=True)
class Trajectory:
    """An iteration's transitions, [T][N] lists (T steps of N envs, chunks concatenated
    in env-worker order), as they cross to the learner."""
    obs: list[list[list[float]]]
    actions: list[list[Any]]
    logprobs: list[list[float]]
    rewards: list[list[float]]
    terminated: list[list[bool]]
    truncated: list[list[bool]]
    final_obs: list[list[list[float] | None]]
    """Where step t truncated an episode: the observation it ended on; else None."""
    last_obs: list[list[float]]
    """The observation after the horizon's last step, per env."""

    def __post_init__(self) -> None:
        t = len(self.obs)
        for name in ("actions", "logprobs", "rewards", "terminated", "truncated", "final_obs"):
            if len(getattr(self, name)) != t:
                raise ValueError(f"trajectory {name} has {len(getattr(self, name))} steps, obs has {t}")
        n = len(self.last_obs)
        if any(len(row) != n for name in ("obs", "actions", "rewards") for row in getattr(self, name)):
            raise ValueError(f"every step of a trajectory has {n} envs")

    def to_wire(self) -> list:
        return [self.obs, self.actions, self.logprobs, self.rewards, self.terminated, self.truncated,
                self.final_obs, self.last_obs]

    @classmethod
    def from_wire(cls, w: list) -> "Trajectory":
        return cls(*w)


@register_struct(30)
@dataclass(slots=True)
class Action:
    """The policy's actions for one chunk's observations."""
    actions: list[Any]
    """As sampled (what the learner trains on)."""
    logprobs: list[float]
    env_actions: list[Any]
    """What the envs step: clipped to a Box's bounds, ints for a Discrete."""

    def to_wire(self) -> list:
        return [self.actions, self.logprobs, self.env_actions]

    @classmethod
    def from_wire(cls, w: list) -> "Action":
        return cls(*w)


class PolicyWorker(dynarl.Worker):
    def __init__(self, spec: EnvSpec, hidden: int) -> None:
        self.spec = spec
        self.actor = Actor(self.spec, hidden)
        self.weight_version = -1

    async def act(self, obs: list[list[float]], seed: int) -> Action:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            dist = self.actor.distribution(torch.tensor(obs, dtype=torch.float32))
            if self.spec.discrete:
                actions = torch.multinomial(dist.probs, 1, generator=generator).squeeze(-1)
            else:
                actions = dist.mean + dist.stddev * torch.randn(dist.mean.shape, generator=generator)
            logprobs = self.actor.log_prob(dist, actions)
        return Action(actions.tolist(), logprobs.tolist(), clip(self.spec, actions))

    async def receive_weights(self, group: str, version: int) -> int:
        params = dict(self.actor.named_parameters())

        async def load(named: list, at: int) -> None:
            with torch.no_grad():
                for name, tensor in named:
                    params[name].copy_(tensor)
            self.weight_version = at

        await weight_sync.receive_async(self.process_group(group), self.actor, BUCKET_BYTES, self.weight_version,
                                        version, load, self.device)
        return version


class LearnerWorker(dynarl.Worker):
    def __init__(self, spec: EnvSpec, config: EmbodiedSection, seed: int) -> None:
        self.spec = spec
        self.config = config
        torch.manual_seed(seed)  # the same initial weights for the same seed
        self.actor = Actor(self.spec, config.hidden)
        self.critic = Critic(self.spec, config.hidden)
        self.optimizer = torch.optim.Adam([*self.actor.parameters(), *self.critic.parameters()], lr=config.lr,
                                          eps=1e-5)
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.step = 0
        self.dp_group: Any = None
        """The data-parallel group of the learner's ranks (start), or None: one rank."""

    async def start(self, dp_group: str | None = None) -> None:
        """Collective over `dp_group` when given: the ranks average their gradients at
        every update (they start from the same weights: the same seed)."""
        self.dp_group = self.process_group(dp_group) if dp_group else None

    def _average(self, grads: list[torch.Tensor]) -> None:
        """Every rank's gradients, averaged over the group (in place; one all-reduce)."""
        import torch.distributed as dist
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        flat /= dist.get_world_size(self.dp_group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    async def train(self, trajectory: Trajectory) -> PPOMetrics:
        return await asyncio.to_thread(self._train, trajectory)

    def _train(self, tr: Trajectory) -> PPOMetrics:
        c = self.config
        obs = torch.tensor(tr.obs, dtype=torch.float32)                       # [T, N, D]
        t, n = obs.shape[:2]
        terminated = torch.tensor(tr.terminated, dtype=torch.bool)
        truncated = torch.tensor(tr.truncated, dtype=torch.bool)
        following = torch.cat([obs[1:], torch.tensor(tr.last_obs, dtype=torch.float32)[None]])
        for step, row in enumerate(tr.final_obs):  # a truncated episode continues from where it ended
            for env, final in enumerate(row):
                if final is not None:
                    following[step, env] = torch.tensor(final, dtype=torch.float32)
        with torch.no_grad():
            values, next_values = self.critic(obs), self.critic(following)
        advantages, returns = gae(torch.tensor(tr.rewards, dtype=torch.float32), values, next_values, terminated,
                                  truncated, c.gamma, c.lam)
        actions = torch.tensor(tr.actions, dtype=torch.long if self.spec.discrete else torch.float32)
        data = Rollout(obs=obs.reshape(t * n, -1), actions=actions.reshape(t * n, *actions.shape[2:]),
                       logprobs=torch.tensor(tr.logprobs, dtype=torch.float32).reshape(-1),
                       advantages=advantages.reshape(-1), returns=returns.reshape(-1), values=values.reshape(-1))
        metrics = ppo_update(self.actor, self.critic, self.optimizer, data, epochs=c.epochs, minibatches=c.minibatches,
                             clip_eps=c.clip_eps, value_coef=c.value_coef, entropy_coef=c.entropy_coef,
                             max_grad_norm=c.max_grad_norm, generator=self.generator,
                             average=self._average if self.dp_group is not None else None)
        self.step += 1
        if not self.spec.discrete:
            metrics.action_std = float(self.actor.log_std.detach().exp().mean())
        return metrics

    def weights_digest(self) -> str:
        """A hash of the actor's and critic's weights (data-parallel replicas compare equal)."""
        import hashlib
        h = hashlib.sha256()
        for tensor in [*self.actor.state_dict().values(), *self.critic.state_dict().values()]:
            h.update(tensor.detach().contiguous().numpy().tobytes())
        return h.hexdigest()

    async def send_weights(self, group: str, version: int) -> int:
        buckets = [[(name, p.detach()) for name, p in bucket] for bucket in
                   _buckets(self.actor.named_parameters())]
        return await weight_sync.send_async(self.process_group(group), *weight_sync.unbucket(buckets), version,
                                            device=self.device)

    async def save_checkpoint(self, path: str) -> int:
        """One safetensors file: actor, critic, Adam's per-parameter state and the RNG
        (tensors); its step counts and the learner's step in the metadata (no pickle)."""
        os.makedirs(path, exist_ok=True)
        tensors = {f"actor.{k}": v for k, v in self.actor.state_dict().items()}
        tensors |= {f"critic.{k}": v for k, v in self.critic.state_dict().items()}
        tensors["generator"] = self.generator.get_state()
        steps = {}
        for i, state in self.optimizer.state_dict()["state"].items():
            tensors[f"adam.{i}.exp_avg"], tensors[f"adam.{i}.exp_avg_sq"] = state["exp_avg"], state["exp_avg_sq"]
            steps[str(i)] = float(state["step"])
        meta = {"step": str(self.step), "adam_steps": json.dumps(steps)}
        if self.rank > 0:  # data-parallel replicas hold the same state: rank 0 writes it
            return self.step
        with atomic_open(os.path.join(path, CHECKPOINT_FILE), "wb") as f:
            f.write(safetensors.torch.save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta))
        return self.step

    async def load_checkpoint(self, path: str) -> int:
        file = os.path.join(path, CHECKPOINT_FILE)
        with safetensors.safe_open(file, framework="pt") as f:
            meta = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        self.actor.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("actor.")})
        self.critic.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("critic.")})
        optim = self.optimizer.state_dict()
        optim["state"] = {int(i): {"step": torch.tensor(step), "exp_avg": tensors[f"adam.{i}.exp_avg"],
                                   "exp_avg_sq": tensors[f"adam.{i}.exp_avg_sq"]}
                          for i, step in json.loads(meta["adam_steps"]).items()}
        self.optimizer.load_state_dict(optim)
        self.generator.set_state(tensors["generator"])
        self.step = int(meta["step"])
        return self.step


def _buckets(named) -> list:
    from dynarl.components.trainer.base import bucket_by_bytes
    return list(bucket_by_bytes(named, BUCKET_BYTES))
