"""The embodied workflow's workers on emulated devices (`embodied.backend: emulated`):
what `dynarl sim --workload embodied` runs, with the protocol of the real ones
(env_worker.py, workers.py), time from measurements and the cost model, no tensors.

    EmulatedEnvWorker      one `step` is an action chunk's env steps of its envs:
                           num_envs x action_chunk x env_step_s (`dynarl bench env`)
    EmulatedPolicyWorker   `act` is one forward of the policy over the chunk's envs,
                           obs_tokens + action_tokens each (a VLA's parallel decoding):
                           the cost model's prefill time
    EmulatedLearner        the emulated trainer (a TrainerWorker, so it reshards P2P like
                           the GRPO trainer): `train` is the value head's forward, then
                           one PPO step, over one sequence per act of its envs

Observations are zeros of the spec's size and actions zeros: nothing learns, only
the time and the bytes are the real run's.
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass
from typing import Any

import dynarl
from dynarl.components import costmodel as cm
from dynarl.components import weight_sync
from dynarl.components.embodied.env_worker import EnvStep, check_slice
from dynarl.components.embodied.spaces import EnvSpec
from dynarl.components.embodied.workers import Action, Trajectory
from dynarl.components.trainer.base import TrainBatch
from dynarl.components.trainer.worker import TrainerWorker
from dynarl.components.workflows.embodied_config import EmulatedEmbodiedConfig
from dynarl.transport.wire import register_struct


@register_struct(65)
@dataclass(kw_only=True, slots=True)
class EmulatedTrainMetrics:
    """An emulated learner's iteration (EmulatedLearner.train, a wire record): the
    trainer's loss (0: emulated), the sequences it trained, the loop seconds it took.
    Its fields go into the step's metrics row (row)."""
    loss: float
    sequences: float
    time_s: float

    def row(self) -> dict[str, Any]:
        return asdict(self)


class EmulatedEnvWorker(dynarl.Worker):
    def __init__(self, env_id: str, num_envs: int, seed: int, spec: EnvSpec, emulated: EmulatedEmbodiedConfig) -> None:
        self.env_id, self.num_envs, self.spec, self.emulated = env_id, num_envs, spec, emulated

    def observations(self, first: int = 0, count: int | None = None) -> list[list[float]]:
        n = self.num_envs - first if count is None else count
        return [[0.0] * self.spec.obs_dim for _ in range(n)]

    async def step(self, actions: list, first: int = 0) -> EnvStep:
        n = len(actions)
        check_slice(first, n, self.num_envs)
        busy = self.emulated.env_s(n)
        await asyncio.sleep(busy * self.emulated.time_scale)
        return EnvStep(obs=self.observations(first, n), rewards=[0.0] * n, terminated=[False] * n,
                       truncated=[False] * n,
                       final_obs=[None] * n, episodes=[], busy_s=busy * self.emulated.time_scale)


class EmulatedPolicyWorker(dynarl.Worker):
    def __init__(self, spec: EnvSpec, hidden: int, emulated: EmulatedEmbodiedConfig,
                 shares_device: bool = False) -> None:
        self.spec, self.emulated, self.shares_device = spec, emulated, shares_device
        self.weight_version = -1

    async def act(self, obs: list[list[float]], seed: int) -> Action:
        await asyncio.sleep(self.emulated.act_s(len(obs)) * self.emulated.time_scale)
        zeros = [0 if self.spec.discrete else [0.0] * self.spec.action_dim for _ in obs]
        return Action(zeros, [0.0] * len(obs), zeros)

    async def receive_weights(self, group: str, version: int) -> int:
        """The whole model over one link (an emulated group moves nothing)."""
        async def load(_: Any, at: int) -> None:
            d = cm.get_device(self.emulated.device)
            seconds = cm.weight_sync_time(cm.get_model(self.emulated.model).weight_bytes, d.link_bandwidth)
            await asyncio.sleep(seconds * self.emulated.time_scale)
            self.weight_version = at

        await weight_sync.receive_async(self.process_group(group), None, 0, self.weight_version, version, load)
        return version

    async def onload(self) -> None:
        if self.shares_device:  # half a role switch each way (docs/COSTMODEL.md §3)
            await asyncio.sleep(cm.ROLE_SWITCH_S / 2 * self.emulated.time_scale)

    async def offload(self) -> None:
        if self.shares_device:
            await asyncio.sleep(cm.ROLE_SWITCH_S / 2 * self.emulated.time_scale)


class EmulatedLearner(TrainerWorker):
    """The learner's protocol (train a Trajectory, send the actor's weights) on the
    emulated trainer; one rank of a data-parallel group, trained on its part of the
    envs (the workflow splits the trajectory)."""

    def __init__(self, *args, emulated: EmulatedEmbodiedConfig, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.emulated = emulated

    async def train(self, trajectory: Trajectory) -> EmulatedTrainMetrics:  # (the embodied learner's protocol)
        sequences = sum(len(row) for row in trajectory.obs)
        seq, prompt = self.emulated.sequence, self.emulated.obs_tokens
        batch = TrainBatch(input_ids=[range(seq)] * sequences, prompt_lens=[prompt] * sequences,
                           advantages=[0.0] * sequences)
        loop = asyncio.get_running_loop()
        begun = loop.time()
        self.training = True
        try:
            await self.trainer.values(batch)
            metrics = await self.trainer.train_step(batch)
        finally:
            self.training = False
        return EmulatedTrainMetrics(loss=metrics.loss, sequences=float(sequences), time_s=loop.time() - begun)
