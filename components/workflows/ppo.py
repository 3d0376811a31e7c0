"""PPO, the macro flow: GRPO's step (grpo.py) with a critic in place of the group
baseline.

    rollout, reward, inference     as GRPO: samples, rewards, old (and reference) log-probs
    critic     "compute_values"    V_t for every response token, on the critic's weights
    controller gae_targets         per sample: the reward on its last token, GAE over its
                                   tokens; advantages whitened over the batch
    trainer    one step            the clipped policy loss on the token advantages  } started together;
    critic     one step            the clipped value loss towards the GAE returns   } on shared devices in turn
    weight sync trainer -> rollout, inference

The critic is a worker group of its own (TrainerWorker with a value head,
trainer/native/critic.py: its own AdamW and FSDP2 state over "critic_dp") on the
trainer's home devices. It starts from the warm-started policy's decoder (or from
critic.model) and its state goes into every checkpoint, under critic/. Under the
DynaRL scheduler the critic follows the trainer: each P2P move of the trainer
(rollout's tail devices in, home again) reshards the critic onto the same devices,
from warm standbys, and the scheduler prices the trainer's work with the critic's
(rates.trainer_passes).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native.losses import explained_variance, gae
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows.grpo import GRPO
from dynarl.components.workflows.joins import StepRanks
from dynarl.components.workflows.rates import trainer_passes
from dynarl.components.workflows.stages import held
from dynarl.core.migration.p2p import MigrationFailed, p2p_migrate
from dynarl.core.migration.standby import StandbyPool
from dynarl.core.worker_group import WorkerGroup, gather_or_cancel

CRITIC_DIR = ckpt.CRITIC_DIR
CRITIC_INIT_DIR = "critic_init"
"""The warm-started policy the critic starts from, as an HF folder in the run directory."""


@dataclass(frozen=True, slots=True)
class Targets:
    advantages: list[list[float]]
    """Per response token: GAE, whitened over the batch's loss tokens when asked."""
    returns: list[list[float]]
    """Per response token: the critic's regression target, GAE + V (not whitened)."""
    explained_variance: float | None
    """1 - Var(R - V) / Var(R) over the loss tokens: how much of the returns the values
    explain (1 perfect, 0 no better than their mean, < 0 worse); None where Var(R) = 0."""


def gae_targets(rewards: Sequence[float], values: Sequence[Sequence[float]],
                response_mask: Sequence[Sequence[int]] | None, *, gamma: float, lam: float,
                whiten: bool) -> Targets:
    """Advantages and returns of a batch of outcome-rewarded samples: sample i's reward
    is paid on its last response token in the loss (mask 1), every other token gets 0,
    and `losses.gae` runs over its tokens (masked ones skipped)."""
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards for {len(values)} samples' values")
    advantages, returns, masks = [], [], []
    for i, (reward, v) in enumerate(zip(rewards, values)):
        mask = torch.tensor(response_mask[i] if response_mask is not None else [1] * len(v), dtype=torch.float32)
        if len(mask) != len(v):
            raise ValueError(f"sample {i}: {len(v)} values for {len(mask)} response tokens")
        r = torch.zeros(len(v))
        kept = mask.nonzero()
        if len(kept):
            r[int(kept[-1])] = float(reward)
        a, ret = gae(r, torch.tensor(v, dtype=torch.float32), mask, gamma, lam)
        advantages.append(a)
        returns.append(ret)
        masks.append(mask.bool())
    flat_mask = torch.cat(masks) if masks else torch.zeros(0, dtype=torch.bool)
    flat_adv = torch.cat(advantages)[flat_mask] if masks else torch.zeros(0)
    flat_ret = torch.cat(returns)[flat_mask] if masks else torch.zeros(0)
    flat_val = torch.cat([torch.tensor(v, dtype=torch.float32) for v in values])[flat_mask] if masks else torch.zeros(0)
    explained = explained_variance(flat_val, flat_ret)
    if whiten and flat_adv.numel() > 1:
        mean, std = flat_adv.mean(), flat_adv.std()
        advantages = [torch.where(m, (a - mean) / (std + 1e-8), torch.zeros_like(a)) for a, m in zip(advantages, masks)]
    return Targets([a.tolist() for a in advantages], [r.tolist() for r in returns], explained)


class PPOStepRanks(StepRanks):
    async def replaced(self, component: str, group: WorkerGroup) -> None:
        """A P2P move replaced the trainer: the critic follows it onto its devices."""
        await super().replaced(component, group)
        if component == "trainer":
            await self.wf.follow(group.devices)


class PPO(GRPO):
    step_ranks = PPOStepRanks
    trainer_passes = trainer_passes(critic=True)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.critic_pool: StandbyPool | None = None
        """policy dynarl: warm critic ranks wherever the trainer may move (follow)."""
        self.critic: WorkerGroup | None = None
        self.critic_metrics: dict[str, Any] = {}
        """The last step's critic figures (value loss, explained variance), into its metrics."""

    async def spawn(self) -> Any:
        groups = await super().spawn()
        cfg = self.cfg
        self.critic = await self.ctl.spawn(
            TrainerWorker, name="critic", devices=self.placement.rank_devices("trainer"),
            init={"model": cfg.critic.model or cfg.model, "engine": cfg.critic.engine, "warmup_lr": cfg.critic.engine.lr,
                  "bucket_bytes": cfg.trainer.sync_bucket_bytes, "shares_device": True, "head": "value",
                  "backend": cfg.trainer.backend, "backend_config": cfg.trainer.emulated})
        if self.critic.world_size > 1:
            await self.ctl.process_group("critic_dp", [self.critic])
        if self.scheduling is not None:  # as the trainer's: two on every device it may come to hold
            mover = self.scheduling.mover
            self.critic_pool = StandbyPool(self.ctl, TrainerWorker, "critic",
                                           dict(self.critic.handles[0].spec.init_kwargs), warm=TrainerWorker.reshard_warm)
            await self.critic_pool.fill(2 * mover.devices)
        return groups

    async def follow(self, devices: list[int]) -> None:
        """The critic reshards peer-to-peer onto `devices` (the trainer's, after a move):
        its values and its step run on every device the trainer holds. The move is logged
        as "p2p" of "critic" and its state's link time charged, as the trainer's."""
        if sorted(self.critic.devices) == sorted(devices):
            return
        mover = self.scheduling.mover
        begun, old = mover.now(), list(self.critic.devices)
        try:
            self.critic = (await p2p_migrate(self.ctl, self.critic, list(devices),
                                             dict(self.critic.handles[0].spec.init_kwargs),
                                             dp_group_prefix="critic_dp", standby=self.critic_pool)).group
        except MigrationFailed as exc:  # rolled back: the critic works where it was; tried again (rejoin)
            self.progress.note(f"scheduler: the critic stays on devices {old} for now: {exc}")
            return
        await mover.charge(mover.costs.state_s)
        mover.record("p2p", "critic", [d for d in devices if d not in old], begun)

    async def start_critic(self, init_from: str | None) -> None:
        group = "critic_dp" if self.critic.world_size > 1 else None
        await self.critic.call(TrainerWorker.start, group, None, init_from)

    async def warm_started(self) -> None:
        """The critic starts from the warm-started policy's decoder (critic.model None)."""
        init_from = None
        if self.cfg.critic.model is None and self.run_dir is not None:
            init_from = os.path.join(self.run_dir, CRITIC_INIT_DIR)
            await self.g.trainer.on(self.export_ranks).call(TrainerWorker.save_model, init_from)
        await self.start_critic(init_from)

    async def save_components(self, path: str) -> None:
        critic = self.critic
        await held(self.ctl, critic, self.clock, f"checkpoint {os.path.basename(path)}", "save_checkpoint",
                   lambda: critic.call(TrainerWorker.save_checkpoint, os.path.join(path, CRITIC_DIR)),
                   component="critic")

    async def restore(self, path: str, state: ckpt.CheckpointState) -> int:
        refused = ckpt.workflow_refused(path, "ppo")  # (dynarl train checks it before any worker starts)
        if refused is not None:
            raise ValueError(f"{path}: {refused}")
        where = os.path.join(path, CRITIC_DIR)
        await self.start_critic(None)  # the layout only: the checkpoint's weights replace the init
        critic = self.critic
        await held(self.ctl, critic, self.clock, "restore", "load_checkpoint",
                   lambda: critic.call(TrainerWorker.load_checkpoint, where), component="critic")
        return await super().restore(path, state)

    async def rejoin(self) -> None:
        """The critic back on the trainer's devices where a follow failed (policy dynarl):
        before the critic's passes, and after the step's restore."""
        if self.scheduling is not None:
            await self.follow(self.g.trainer.devices)  # (nothing moves where it is already there)

    async def step(self, step: int) -> dict[str, Any]:
        metrics = await super().step(step)
        await self.rejoin()
        return metrics | self.critic_metrics | {"critic_s": self.clock.durations(f"step {step}").get("critic", 0.0)}

    async def train(self, batch: TrainBatch, label: str, method: Any = TrainerWorker.train) -> TrainMetrics:
        """The policy's step on GAE advantages and the critic's on the returns."""
        if method is not TrainerWorker.train:  # the warm start: the policy alone
            return await super().train(batch, label, method)
        c = self.cfg.critic
        await self.rejoin()
        values = await self.values(batch, label)
        if self.lengths_only:  # emulated engines (dynarl sim): the passes' time, no values to learn from
            policy, critic = await gather_or_cancel([super().train(batch, label), self.train_critic(batch, label)])
            self.critic_metrics = {"critic_grad_norm": critic.grad_norm}
            return policy
        targets = gae_targets(batch.rewards, values, batch.response_mask, gamma=c.gamma, lam=c.lam, whiten=c.whiten)
        policy_batch = dataclasses.replace(batch, advantages=targets.advantages)
        critic_batch = TrainBatch(input_ids=batch.input_ids, prompt_lens=batch.prompt_lens,
                                  response_mask=batch.response_mask, group_ids=batch.group_ids,
                                  returns=targets.returns, old_values=values)
        policy, critic = await gather_or_cancel([super().train(policy_batch, label),
                                                 self.train_critic(critic_batch, label)])
        n = sum(len(v) for v in values) or 1
        self.critic_metrics = {"value_loss": critic.loss, "value_clip_frac": critic.value_clip_frac,
                               "critic_grad_norm": critic.grad_norm, "explained_var": targets.explained_variance,
                               "value_mean": sum(map(sum, values)) / n}
        return policy

    async def values(self, batch: TrainBatch, label: str) -> list[list[float]]:
        """The critic's V per response token, each rank on its part of the batch (the
        tokens only), put back in the batch's order."""
        critic = self.critic
        size = critic.world_size
        parts = [batch.shard_indices(rank, size) for rank in range(size)]
        slim = TrainBatch(input_ids=batch.input_ids, prompt_lens=batch.prompt_lens, response_mask=batch.response_mask,
                          advantages=[0.0] * len(batch), group_ids=batch.group_ids)
        shards = [[slim.select(p).to_wire()] for p in parts]
        results = await held(self.ctl, critic, self.clock, label, "compute_values",
                             lambda: critic.scatter(TrainerWorker.compute_values, shards), component="critic")
        if self.lengths_only:
            return []
        values: list[list[float] | None] = [None] * len(batch)
        for indices, part in zip(parts, results):
            if len(part) != len(indices):
                raise RuntimeError(f"the critic gave values for {len(part)} samples of its part's {len(indices)}")
            for i, row in zip(indices, part):
                values[i] = row
        return values

    @property
    def lengths_only(self) -> bool:
        """Emulated engines: batches carry lengths, the critic gives no values."""
        return self.cfg.trainer.backend == "emulated"

    def worker_groups(self) -> list[WorkerGroup]:
        return [*super().worker_groups(), self.critic]

    async def train_critic(self, batch: TrainBatch, label: str) -> TrainMetrics:
        critic = self.critic
        size = critic.world_size
        shards = [[batch.shard(rank, size).to_wire()] for rank in range(size)]
        results = await held(self.ctl, critic, self.clock, label, "train",
                             lambda: critic.scatter(TrainerWorker.train, shards), component="critic")
        return results[0]
