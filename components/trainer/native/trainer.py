"""The native trainer: GRPO (or another objective, TrainerConfig.objective: native/
objectives.py) on a torch causal LM, data parallel with torch FSDP2.

Each decoder layer and the root are `fully_shard`ed over the data-parallel group, so
every parameter is a DTensor sharded on dim 0 and a rank holds its rows of the fp32
weights, of their gradients and of AdamW's moments (torch.optim.AdamW on the
DTensors): the state falls as 1/N with N ranks. A model in bf16 trains under a
MixedPrecisionPolicy (bf16 compute, fp32 gradient reduction, fp32 master weights);
`cpu_offload` on a GPU keeps the state in host memory (CPUOffloadPolicy). A step:

    forward/backward per micro-batch     FSDP gathers a layer's weights for it and
                                         reduce-scatters its gradients (a sum: the
                                         loss is scaled by the *global* token count)
    the same number of passes per rank   a rank with fewer micro-batches runs idle
                                         passes, so the collectives pair up
    global grad norm, clip, AdamW        on the shards, at the step's learning rate
                                         (lr_schedule.py); a norm that is not finite
                                         leaves the state as it was

Streaming (`begin_stream`, `accumulate`, `apply`) gathers the weights once, runs
each part's forward/backward without any collective (ranks take parts as they
come), and reduces the gradients in `apply`.

torch's DeviceMesh reads the default group: the trainer's DP group becomes the
world (trainer/world.py).
"""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any, Generator, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from dynarl.components.model.lora import LoraLinear, merge_lora
from dynarl.components.trainer.base import TrainBatch, TrainerConfig, bucket_by_bytes
from dynarl.components.trainer.lr_schedule import lr_at
from dynarl.components.trainer.megatron.layout import WEIGHTS, ShardedLayout
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native import checkpoint
from dynarl.components.trainer.native import fsdp
from dynarl.components.trainer.native.layout import fsdp_layout
from dynarl.components.trainer.advantages import WHOLE_BATCH, loss_samples
from dynarl.components.trainer.native.losses import entropy_from_logprobs
from dynarl.components.trainer.native.objectives import micro_batch_loss, step_advantages
from dynarl.components.trainer.native.micro_batch import MicroBatch, micro_batches
from dynarl.components.trainer.world import init_default_group, leave_default_group

MOMENTS = ("exp_avg", "exp_avg_sq")
"""AdamW's per-element state: with the weights, the state kinds a reshard moves."""


class NativeTrainer:
    """One data-parallel rank. Collective methods (the constructor, train_step,
    begin_stream, apply, values of a critic, named_weights, save/load_checkpoint) must
    be called on every rank of `process_group`."""
    frees_offloaded_state = False
    """(trainer/engine.py TrainerEngine)"""

    TERMS: tuple[str, ...] = ("loss", "pg_loss", "kl", "entropy", "clip_frac", "rollout_capped_frac")
    """The loss terms a step reports (token-means over the global batch; TrainMetrics fields)."""

    def __init__(self, model: torch.nn.Module, config: TrainerConfig,
                 process_group: dist.ProcessGroup | None = None) -> None:
        self.config = config
        self.rank = process_group.rank() if process_group is not None else 0
        self.world_size = process_group.size() if process_group is not None else 1
        self.global_step = 0
        named = list(model.named_parameters())  # tied weights appear once
        if not named:
            raise ValueError("model has no parameters")
        self.device = named[0][1].device
        self.dtype = named[0][1].dtype  # what the model computes in and named_weights hands out
        init_default_group(process_group)
        self.group: dist.ProcessGroup = dist.distributed_c10d._get_default_group()
        if self.world_size > 1:  # replicas start identical, as DDP does: rank 0's weights win
            with torch.no_grad():
                for _, p in named:
                    dist.broadcast(p.data, group_src=0, group=self.group)
        self._names = [n for n, _ in named]
        self._shapes = [(n, tuple(p.shape), "float32") for n, p in named]
        mesh = DeviceMesh.from_group(self.group, "cuda" if self.device.type == "cuda" else "cpu")  # (meta: sizes)
        self.offloaded_by_fsdp = config.cpu_offload and self.device.type == "cuda"
        self.model = fsdp.shard(model.float(), mesh, self.dtype, self.offloaded_by_fsdp)
        self._params = [p for _, p in self.model.named_parameters()]
        self._lora_scaling = next((m.scaling for m in self.model.modules() if isinstance(m, LoraLinear)), 0.0)
        self._layout = fsdp_layout(self._shapes, self.world_size)
        decay = [p for p in self._params if p.requires_grad and p.dim() >= 2]
        rest = [p for p in self._params if p.requires_grad and p.dim() < 2]
        # weight decay applies to matrices only (not biases or norm scales)
        groups: list[dict[str, Any]] = [{"params": decay}, {"params": rest, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups,
                                           lr=config.lr, betas=config.betas, eps=config.eps)
        for p in decay + rest:  # the state exists from the start: a reshard or checkpoint moves it
            self.optimizer.state[p] = {"step": torch.tensor(0.0), **{m: torch.zeros_like(p) for m in MOMENTS}}
        self._rng_state = torch.Generator().manual_seed(config.seed + self.rank).get_state()
        self._onloaded = True
        self._pending: dict | None = None  # streaming: loss tokens and metric sums since begin_stream

    trainable = property(lambda self: [p for p in self._params if p.requires_grad])

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """Collective. One AdamW step on this rank's part of the global batch (see
        `TrainBatch.shard`). Loss is the token-mean over the whole global batch."""
        advantages = self._advantages(batch, self._reduce)
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before train_step()")
        counts = self._all_reduce(torch.tensor([float(batch.num_loss_tokens()), float(loss_samples(batch))],
                                               dtype=torch.float64, device=self.device))
        num_tokens, num_samples = int(counts[0].item()), int(counts[1].item())
        if num_tokens == 0:
            raise ValueError("the global batch has no response tokens with mask 1")
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()
        micro = [mb for mb in self._micro_batches(batch, advantages) if mb.num_tokens]
        passes = int(self._all_reduce(torch.tensor([len(micro)], device=self.device), dist.ReduceOp.MAX).item())
        sums = self._zero_terms()
        with self._own_rng():
            for index in range(passes):
                if index < len(micro):
                    sums += self._forward_backward(micro[index], num_tokens, num_samples)
                else:
                    self._idle_pass()
        return self._step(sums, num_tokens)

    def begin_stream(self) -> None:
        """Collective. Gathers the weights and keeps them, so each `accumulate` runs
        without a collective; the gradients stay local until `apply`."""
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before begin_stream()")
        self.optimizer.zero_grad(set_to_none=True)
        for module in self._fsdp_modules():
            module.set_reshard_after_forward(False, recurse=False)
            module.set_reshard_after_backward(False, recurse=False)
            module.set_requires_gradient_sync(False, recurse=False)
            module.unshard()
        self._pending = {"tokens": 0, "sums": self._zero_terms()}

    def accumulate(self, batch: TrainBatch) -> None:
        """Streaming gradient accumulation: forward/backward of one part of this step's
        batch (advantages precomputed: `batch.advantages`, or whole groups), its loss
        terms summed over tokens; `apply` divides by the step's global token count,
        so the step equals one train_step over all the parts. Not collective."""
        if self._pending is None:
            raise RuntimeError("accumulate() before begin_stream()")
        if self.config.objective in WHOLE_BATCH:
            raise ValueError(f"objective {self.config.objective} needs the whole batch in one step: "
                             "set trainer.streaming false")
        self._pending["tokens"] += batch.num_loss_tokens()
        self.model.train()
        with self._own_rng():
            for mb in self._micro_batches(batch, self._advantages(batch)):
                if mb.num_tokens:
                    self._pending["sums"] += self._forward_backward(mb, 1)

    def apply(self) -> TrainMetrics:
        """Collective. The optimizer step over every part accumulated since
        begin_stream, on every rank (one that took no part adds zero gradients)."""
        pending = self._pending or {"tokens": 0, "sums": self._zero_terms()}
        self._pending = None
        for module in self._fsdp_modules():
            module.set_requires_gradient_sync(True, recurse=False)
            module.set_reshard_after_backward(True, recurse=False)
        self._idle_pass()  # its backward reduce-scatters every gradient accumulated so far
        for module in self._fsdp_modules():
            module.set_reshard_after_forward(True, recurse=False)
            module.reshard()
        num_tokens = int(self._all_reduce(torch.tensor([float(pending["tokens"])], dtype=torch.float64,
                                                       device=self.device)).item())
        if num_tokens == 0:
            self.optimizer.zero_grad(set_to_none=True)
            raise ValueError("the step accumulated no response tokens with mask 1 on any rank")
        for p in self.trainable:
            if p.grad is not None:
                p.grad.div_(num_tokens)
        return self._step(pending["sums"] / num_tokens, num_tokens)

    def _step(self, sums: torch.Tensor, num_tokens: int) -> TrainMetrics:
        """The optimizer step on the reduced gradients; the global metrics."""
        grad_norm = self._update()
        self._all_reduce(sums)
        self.global_step += 1
        terms: dict[str, Any] = dict(zip(self.TERMS, sums.tolist()))
        return TrainMetrics(**terms, grad_norm=grad_norm, tokens=num_tokens, step=self.global_step)

    def _update(self) -> float:
        """Clip by the global norm and step AdamW. Returns the pre-clip global grad norm.
        A norm that is not finite leaves the state as it was (on every rank: the norm
        is global): the update would turn the weights and both moments to nan for
        good, and the workflow decides whether the run stops or goes on (trainer.nonfinite)."""
        cfg = self.config
        params = self.trainable
        for p in params:  # every parameter steps (AdamW's count stays one number; decay applies)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True)
        grad_norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            return grad_norm
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, cfg.grad_clip, norm, foreach=True)
        decay, rest = self.optimizer.param_groups
        for group in (decay, rest):  # (the config may be the warm start's, swapped in for a step)
            group.update(lr=lr_at(self.global_step, cfg), betas=cfg.betas, eps=cfg.eps)
        decay["weight_decay"] = cfg.weight_decay
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _micro_batches(self, batch: TrainBatch, advantages: Sequence[Any]) -> list[MicroBatch]:
        """Padded micro-batches of micro_batch_size samples, or packed ones of at most
        max_tokens_per_micro_batch tokens (micro_batch.py)."""
        return micro_batches(batch, advantages, self.config, self.device)

    def _advantages(self, batch: TrainBatch, reduce: Any = None) -> list:
        """What the loss of `batch` weighs its tokens by: the objective's (or the batch's own)
        advantages; `reduce` sums statistics over the ranks (collective: train_step's)."""
        return step_advantages(batch, self.config, reduce)

    def _reduce(self, values: Any) -> Any:
        """Collective. A float64 vector summed over the ranks (reinforce_pp's whitening)."""
        return self._all_reduce(torch.as_tensor(values, dtype=torch.float64, device=self.device)).cpu().numpy()

    def _zero_terms(self) -> torch.Tensor:
        return torch.zeros(len(self.TERMS), dtype=torch.float64, device=self.device)

    def _forward_backward(self, mb: MicroBatch, num_tokens: int, num_samples: int = 1) -> torch.Tensor:
        """Backward of this micro-batch's share of the global loss (token-mean; dr_grpo
        and gspo: per-sample, `num_samples`); returns its (loss, pg, kl, entropy,
        clip_frac, rollout_capped_frac) shares."""
        cfg = self.config
        logits = mb.logits(self.model)
        # Position t predicts token t + 1; keep only the positions in the loss.
        logp = torch.log_softmax(logits[:, :-1][mb.loss_mask].float(), dim=-1)
        logprobs = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        with torch.set_grad_enabled(cfg.entropy_coef > 0):
            entropy = entropy_from_logprobs(logp)
        terms = micro_batch_loss(logprobs, entropy, mb, cfg, num_tokens, num_samples)
        terms.loss.backward()
        return torch.stack([t.detach().double() for t in terms])

    def _idle_pass(self) -> None:
        """A forward/backward that adds nothing to any gradient: FSDP's collectives for
        a rank with no micro-batch left (every rank runs the same number of passes)."""
        out = self.model(torch.zeros(1, 1, dtype=torch.long, device=self.device))
        (out.float().sum() * 0.0).backward()

    # ---- state ------------------------------------------------------------------

    def layout(self) -> ShardedLayout:
        return self._layout

    def export_state_shard(self) -> dict[str, torch.Tensor]:
        """This rank's rows of the weights ("param/<name>") and of each moment
        ("exp_avg/<name>", ...), AdamW's step count ("adam_step") and the trainer's
        ("step", int64 [1]). Views of live state: copy them to outlive the next step."""
        shard: dict[str, torch.Tensor] = {}
        for name, p in zip(self._names, self._params):
            shard[f"{WEIGHTS}/{name}"] = fsdp.local(p).detach()
            state = self.optimizer.state.get(p)
            for moment in MOMENTS:
                shard[f"{moment}/{name}"] = fsdp.local(state[moment]) if state else torch.zeros_like(fsdp.local(p))
        shard["adam_step"] = torch.tensor([self._adam_step()], dtype=torch.int64)
        shard["step"] = torch.tensor([self.global_step], dtype=torch.int64)
        return shard

    def import_state_shard(self, shard: Mapping[str, torch.Tensor]) -> None:
        """Install a shard laid out for this rank (same keys and shapes as
        export_state_shard). Local: no collective."""
        for key in ("adam_step", "step"):
            if key not in shard:
                raise ValueError(f"state shard lacks {key!r}")
        with torch.no_grad():
            for name, p in zip(self._names, self._params):
                targets = [(WEIGHTS, fsdp.local(p))]
                state = self.optimizer.state.get(p)
                if state:
                    targets += [(m, fsdp.local(state[m])) for m in MOMENTS]
                for kind, target in targets:
                    key = f"{kind}/{name}"
                    if key not in shard:
                        raise ValueError(f"state shard lacks {key!r}")
                    if tuple(shard[key].shape) != tuple(target.shape):
                        raise ValueError(f"state shard {key!r} is {tuple(shard[key].shape)}, rank {self.rank} "
                                         f"holds {tuple(target.shape)}")
                    target.copy_(shard[key])
                if state:
                    state["step"].fill_(float(shard["adam_step"].reshape(-1)[0]))
        self.global_step = int(shard["step"].reshape(-1)[0])

    def _adam_step(self) -> int:
        return next((int(s["step"]) for s in self.optimizer.state.values()), 0)

    def save_checkpoint(self, path: str) -> None:
        """Collective. DCP writes every rank's shards; rank 0 the metadata."""
        meta = {"config": self.config.to_wire(), "step": self.global_step, "world_size": self.world_size,
                "params": [[n, list(s)] for n, s, _ in self._shapes]}
        checkpoint.save(path, self._checkpoint_state(), self.group, self.rank, self._rng_state, meta)

    def load_checkpoint(self, path: str) -> None:
        """Collective. Loads a checkpoint written at any world size (DCP re-slices)."""
        meta = checkpoint.load_meta(path)
        mine, theirs = [[n, list(s)] for n, s, _ in self._shapes], meta["params"]
        if mine != theirs:
            diff = next((a, b) for a, b in zip(mine + [None], theirs + [None]) if a != b)
            raise ValueError(f"checkpoint {path} does not match the model: ours {diff[0]}, checkpoint {diff[1]}")
        state = self._checkpoint_state()
        checkpoint.load(path, state, self.group)
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        self.global_step = int(meta["step"])
        rng = checkpoint.read_rng(path, self.rank)
        if rng is not None:
            self._rng_state = rng

    def _checkpoint_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim}

    # ---- weights for rollout; device residency -----------------------------------

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Collective (each parameter is gathered from its shards). Every parameter
        once, in the model's order and dtype, in buckets of at most `bucket_bytes`
        (a parameter larger than that gets a bucket of its own). A LoRA layer's
        adapters come merged into its weight (model/lora.py merge_lora): the plain
        model's tensors, what the rollout engines load."""
        def full() -> Generator[tuple[str, torch.Tensor], None, None]:
            by_unit = self.device.type == "cpu" and self.dtype == torch.float32
            pairs = fsdp.gathered(self.model, self._names, by_unit)
            try:
                for _, module in itertools.groupby(pairs, lambda n_p: n_p[0].rsplit(".", 1)[0]):
                    tensors = {n: p.detach().clone() for n, p in module}
                    merged = merge_lora(tensors, self._lora_scaling) if self._lora_scaling else tensors
                    yield from ((n, t.to(self.dtype)) for n, t in merged.items())
            finally:
                pairs.close()  # a sync cut off mid-way lets its gathered unit go now, not at collection
        stream = full()
        try:
            yield from bucket_by_bytes(stream, bucket_bytes)
        finally:
            stream.close()

    def offload(self) -> None:
        """Move the sharded weights and optimizer state to CPU (device_lock release)."""
        self._move_to(torch.device("cpu"))
        self._onloaded = False

    def onload(self) -> None:
        self._move_to(self.device)
        self._onloaded = True

    is_onloaded = property(lambda self: self._onloaded)

    def close(self) -> None:
        """Leave the default group this trainer made (a later trainer in this process,
        at another DP size, builds its own)."""
        leave_default_group()

    def _move_to(self, device: torch.device) -> None:
        if self.offloaded_by_fsdp or self.device.type == "cpu":  # (the state lives in host memory already)
            return
        for module in self._fsdp_modules():  # (a step cut short may leave a layer gathered)
            module.reshard()
        self.model.to(device)  # FSDP2 re-points its sharded parameters; self._params stay valid
        for state in self.optimizer.state.values():
            for key, t in state.items():
                if key != "step":
                    state[key] = t.to(device)
        if device.type == "cpu" and self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _fsdp_modules(self) -> list[FSDPModule]:
        return [m for m in self.model.modules() if isinstance(m, FSDPModule)]

    def _all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(t, op=op, group=self.group)
        return t

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run with the trainer's CPU RNG stream (dropout), leaving the caller's intact;
        the stream is saved in checkpoints so a resumed run draws the same numbers."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state)
            yield
            self._rng_state = torch.get_rng_state()
