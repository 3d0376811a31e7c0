"""TrainerWorker: one data-parallel rank of the trainer component.

Wraps the configured trainer engine (engine_factory: NativeTrainer, FSDP2 over
the runtime process group `dp_group` when there are several ranks, MegatronTrainer,
whose world is that same group, or the emulated one), through the async
TrainerEngine contract (trainer/base.py). Besides the GRPO step it runs the
supervised warm start, saves/loads checkpoints, and its rank 0 sends the weights to
rollout and inference after every step (weight_sync.py).

Two ways to train a step: `train` takes this rank's part of the batch from the
controller and steps on it (the batch is whole when the step begins); `train_stream`
takes chunks from a channel as inference finishes them, accumulates their
gradients, and steps after END (streaming gradient accumulation: the trainer starts
while the rollout's tail still decodes). It returns a TrainerStats (stage_results.py):
the step's metrics, when it computed, and what it trained (the sample ids and digests
for the ledger, and each sample's reward, length, finish and version).

Warm start = supervised fine-tuning through the same loss: with advantage 1 on
every answer token and the sampling policy equal to the current one (no old
log-probs: ratio exactly 1, nothing clipped), the clipped policy-gradient loss
has exactly the gradient of the answer tokens' negative log-likelihood. Its own
learning rate, no entropy bonus, no KL.

device_lock: when the device is shared, offload moves weights and optimizer
state off the device and onload brings them back (NativeTrainer.offload/onload;
on a CPU device they already live in host memory, so the move costs nothing).
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib
from typing import TYPE_CHECKING, Any

import dynarl
from dynarl.components.model.lora_config import LoraConfig
from dynarl.components.model.spec import ModelSpec
from dynarl.components import experience
from dynarl.components.busy import BusyLog
from dynarl.components.experience import END
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.lr_schedule import constant_lr
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.stage_results import TrainerStats
from dynarl.components.trainer.residency import Residency, on_device
from dynarl.components.trainer.threaded import ThreadedTrainer
from dynarl.core.migration.reshard_records import BoxLayout, FullState, ReshardLayout, StateDigest
from dynarl.core.scheduler.report import RankReport
from dynarl.transport.process_group import EmulatedGroup

if TYPE_CHECKING:
    from dynarl.components.trainer.reshard import Transfer


class TrainerWorker(Residency, dynarl.Worker):
    def __init__(self, model: ModelSpec, engine: TrainerConfig, warmup_lr: float, bucket_bytes: int,
                 shares_device: bool = False, backend: str = "native", backend_config: Any = None,
                 head: str = "policy") -> None:
        """`backend_config`: a MegatronConfig or an EmulatedTrainerConfig (engine_factory.make_trainer).
        `head` "value": this rank is a critic's (PPO): it computes and trains values."""
        self.model = model
        self.head = head
        self.backend, self.backend_config = backend, backend_config
        self.config = engine
        # the warm start's supervised steps train at their own constant lr (no schedule), with
        # grpo's loss whatever the objective (advantage 1, on-policy: the token-mean log-likelihood;
        # the ratio is 1, so a clip bound of cispo's, 1, may become 0 and change nothing)
        low = self.config.clip_eps_low
        self.warmup_config = dataclasses.replace(constant_lr(self.config, warmup_lr), entropy_coef=0.0, kl_coef=0.0,
                                                 objective="grpo", clip_eps_low=0.0 if low >= 1 else low)
        self.bucket_bytes = bucket_bytes
        self._sync_plans: dict[Any, list] = {}
        """The weight sync's buckets per wire dtype (a torch dtype), planned once: a meta model costs ~80 ms."""
        self.shares_device = shares_device
        self.trainer: Any = None
        """A TrainerEngine (trainer/base.py), from engine_factory.make_trainer."""
        from dynarl.components.trainer.reshard import Resharding
        self.reshard = Resharding(self.process_group, self.device)
        """This rank's side of a P2P reshard (core/migration/p2p.py)."""
        self.step_samples = self.step_tokens = 0
        """What the streaming step in progress trained so far."""
        self.training = False

    def metrics(self) -> RankReport:
        """The scheduler's view: what a streaming step trained so far (samples, their
        sequence tokens)."""
        return RankReport(utilization=1.0 if self.training else 0.0, running=int(self.training),
                          samples=self.step_samples, tokens=self.step_tokens)

    async def start(self, dp_group: str | None = None, tensor_parallel_size: int | None = None,
                    init_from: str | None = None, adapters: bool = True) -> int:
        """Collective over `dp_group` (replicas start from rank 0's weights). Returns the
        parameter count. `tensor_parallel_size`: a megatron trainer's TP for this start
        (a P2P reshard to another layout), else the configured one. `init_from`: an HF
        folder whose weights this rank starts from instead of the model's (a critic from
        the warm-started policy's decoder; a LoRA policy from its warm-started base).
        `adapters` False: the whole model trains, model.lora aside (a LoRA run's warm start)."""
        group = self.process_group(dp_group) if dp_group else None
        model = self.model if init_from is None else dataclasses.replace(self.model, path=init_from)
        if not adapters:
            model = dataclasses.replace(model, lora=LoraConfig())
        backend_config = self.backend_config
        if tensor_parallel_size is not None:
            if self.backend != "megatron":
                raise ValueError(f"tensor_parallel_size: the {self.backend} trainer has no tensor parallelism")
            from dynarl.components.trainer.megatron.config import MegatronConfig
            backend_config = dataclasses.replace(backend_config or MegatronConfig(),
                                                 tensor_parallel_size=tensor_parallel_size)
        from dynarl.components.engine_factory import make_trainer
        self.trainer = await make_trainer(self.backend, model, self.config, backend_config, group, head=self.head,
                                          device=self.device)
        return self.model.config().num_parameters if self.backend != "emulated" else 0

    async def onload(self) -> None:
        if self.shares_device:
            await self.set_resident(True)

    async def offload(self) -> None:
        if self.shares_device:
            await self.set_resident(False)

    async def train(self, batch: dict) -> TrainMetrics:
        """Collective. One GRPO step on this rank's part of the global batch."""
        self.training = True
        try:
            return await self.trainer.train_step(TrainBatch.from_wire(batch))
        finally:
            self.training = False

    async def compute_values(self, batch: dict) -> list[list[float]]:
        """A critic's values per response token of `batch` (this rank's part). Not collective."""
        self.training = True
        try:
            return await self.trainer.values(TrainBatch.from_wire(batch))
        finally:
            self.training = False

    async def train_stream(self, get: str, put: str | None = None, *, with_ref: bool = False,
                           behaviour: bool = False) -> TrainerStats:
        """Collective at its end. Chunks of scored groups (each sample with its
        advantage) from `get` until END, accumulated as they come; then the step
        (its TrainMetrics: the result's `metrics`).
        `behaviour`: the samples' own log-probs are the behaviour policy's (decoupled PPO)."""
        inbox, loop = self.channel(get), asyncio.get_running_loop()
        busy, trained = BusyLog(), experience.Trained()
        self.step_samples = self.step_tokens = 0
        self.training = True
        try:
            await self.trainer.begin_stream()
            while (chunk := await inbox.get()) is not END:
                batch = experience.stream_batch(chunk, with_ref, lengths_only=not self.trainer.needs_token_ids,
                                                behaviour=behaviour)
                begun = loop.time()
                await self.trainer.accumulate(batch)
                busy.add(begun, loop.time())
                trained.add(chunk, digests=self.trainer.needs_token_ids)
                self.step_samples += len(batch)
                self.step_tokens += sum(len(ids) for ids in batch.input_ids)
            begun = loop.time()
            metrics = await self.trainer.apply()
            busy.add(begun, loop.time())
        finally:
            self.training = False
        return TrainerStats(metrics=metrics, busy=busy.intervals, trained=trained)

    async def reshard_warm(self) -> None:
        """A warm standby's one-off warm-up (core/migration/standby.py): build a trainer
        alone, take one step on a token-sized batch, drop it; so a migration that adopts
        this rank pays neither the lazy imports nor the first step's allocations. A
        megatron rank only imports megatron-core: built alone, a model that needs TP
        would not fit this device (often a rollout engine's)."""
        if self.backend == "megatron":
            await asyncio.to_thread(importlib.import_module, "megatron.core.models.gpt")
            return
        await self.start(None)
        if self.head == "value":
            probe = TrainBatch(input_ids=[[1, 2, 3, 4]] * 2, prompt_lens=[2, 2], returns=[[1.0, 1.0]] * 2,
                               old_values=[[0.0, 0.0]] * 2)
        else:
            probe = TrainBatch(input_ids=[[1, 2, 3, 4]] * 2, prompt_lens=[2, 2], advantages=[1.0, -1.0])
        await self.trainer.train_step(probe)
        await self.reshard_retire()

    # P2P resharding (core/roles.py ReshardableRank): each a call into self.reshard with the engine
    @on_device
    async def reshard_layout(self) -> ReshardLayout:
        return await self.reshard.layout(self.trainer)

    @on_device
    async def reshard_send(self, group: str, transfers: list[Transfer]) -> int:
        return await self.reshard.send(self.trainer, group, transfers)

    async def reshard_recv(self, group: str, transfers: list[Transfer], start: int, end: int) -> int:
        return await self.reshard.recv(self.trainer, group, transfers, start, end)

    @on_device
    async def reshard_send_boxes(self, group: str, old: BoxLayout, new: BoxLayout, offset: int) -> int:
        return await self.reshard.send_boxes(self.trainer, group, old, new, offset)

    async def reshard_recv_boxes(self, group: str, old: BoxLayout, new: BoxLayout) -> int:
        return await self.reshard.recv_boxes(self.trainer, group, old, new)

    async def reshard_install(self, step: int) -> StateDigest:
        """Returns the installed state's digest, for the controller's confirmation."""
        await self.reshard.install(self.trainer, step)
        return await self.state_digest()

    async def reshard_retire(self) -> None:
        """After the switch: this old rank's state now lives on the new ranks; drop it."""
        if self.trainer is not None:
            await self.trainer.close()
        self.trainer = None
        self.reshard.received = None
        from dynarl.components.device_memory import release_cached_memory
        release_cached_memory()  # (a new rank on this device allocates what this one held)

    @on_device
    async def state_digest(self) -> StateDigest:
        return self.reshard.digest(self.trainer)

    @on_device
    async def full_state(self) -> FullState:
        return self.reshard.full_state(self.trainer)

    async def warmup_step(self, batch: dict) -> TrainMetrics:
        """Collective. One supervised step (advantage 1 on every response token)."""
        return await self.trainer.train_step(TrainBatch.from_wire(batch), self.warmup_config)

    def data_part(self) -> list[int]:
        """[index, count]: this rank's part of the global batch. Its data-parallel rank
        and size: tensor-parallel ranks of one DP rank train on the same part."""
        return [self.trainer.dp_rank, self.trainer.dp_size]

    @on_device
    async def send_weights(self, name: str, version: int) -> int:
        """The trainer's first rank (member 0 of the group `name`) broadcasts the full weights over
        it; returns the bytes sent. Other ranks are called only when the export is
        collective (megatron gathers its TP slices): they build the same buckets with
        rank 0 and return 0. (Member 0, not this process's spawn rank: a rank adopted
        from a standby pool keeps the rank it was spawned with.)
        The weights stream from the engine into the broadcast, bucket by bucket, in
        model.dtype: no rank holds a second copy of the whole model."""
        tensors = self.trainer.weight_stream(self.bucket_bytes)
        try:
            return await self._send(name, version, tensors)
        finally:  # a sync cut off mid-way: the engine lets its gathered weights go now (native/fsdp.py)
            with contextlib.suppress(ValueError):  # (still running in a cancelled call's thread: it ends there)
                getattr(tensors, "close", lambda: None)()

    async def _send(self, name: str, version: int, tensors: Any) -> int:
        try:
            group = self.process_group(name)
        except KeyError:  # a TP rank outside the sync group: it only takes part in the gathers
            group = None
        if group is None or group.rank() != 0:  # its part of megatron's gathers (off the loop; sizes: here)
            if isinstance(self.trainer, ThreadedTrainer):
                await asyncio.to_thread(collections.deque, tensors, 0)
            return 0
        dtype = self.model.engine_dtype(self.device_kind)
        from dynarl.components import weight_sync
        plan: list = []
        if not isinstance(group, EmulatedGroup):
            if dtype not in self._sync_plans:
                self._sync_plans[dtype] = weight_sync.model_plan(self.model, self.bucket_bytes, dtype)
            plan = self._sync_plans[dtype]
        return await weight_sync.send_async(group, plan, tensors, version, dtype, self.device)

    @on_device
    async def save_checkpoint(self, path: str) -> int:
        """Collective. Returns the optimizer step saved."""
        await self.trainer.save_checkpoint(path)
        return self.trainer.global_step

    @on_device
    async def load_checkpoint(self, path: str) -> int:
        """Collective. Returns the optimizer step loaded."""
        await self.trainer.load_checkpoint(path)
        return self.trainer.global_step

    @on_device
    async def save_model(self, path: str) -> None:
        """Rank 0 writes the current weights as an HF folder (the reference policy after
        warm start); other ranks are called only when the export is collective (TP)."""
        from dynarl.components.engine_factory import hf_model
        model = await asyncio.to_thread(hf_model, self.trainer, self.model, self.bucket_bytes)
        if self.rank == 0:
            from dynarl.components.model.io import save_pretrained
            await asyncio.to_thread(save_pretrained, model, path)
