"""The native trainer: GRPO on a torch causal LM, data parallel with ZeRO-1.

Every rank holds the full model (bf16 or fp32) and owns one contiguous range of
the flat parameter space (`sharding.shard_ranges`), for which it keeps the fp32
master copy, AdamW's moments and the reduced gradient. A step:

    forward/backward over micro-batches      (loss scaled by the *global* token count)
    reduce-scatter the flat gradient         (each rank gets the sum for its range)
    global grad norm from per-range squares  (one all-reduce of a scalar)
    clip, AdamW on the owned range           (adamw.py, elementwise)
    all-gather the updated ranges            (every rank has the new full weights)

The process group may be a bare `dist.ProcessGroupGloo(store, rank, size, timeout)`
with no default group (transport/process_group.py builds them so). Checked on
torch 2.13: `dist.all_reduce`, list-form `dist.reduce_scatter` / `dist.all_gather`
and `dist.broadcast(group_src=)` work on such a group; `reduce_scatter_tensor` /
`all_gather_into_tensor` raise AttributeError on it, `broadcast(src=)` wants a
registered group, and gloo's list all_gather needs equal sizes (hence padding).
Only group-relative ranks are used.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from typing import Any, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist

from dynarl.components.trainer.base import (STATE_NAMES, ParamSpec, StateLayout, TrainBatch, TrainerConfig,
                                            bucket_by_bytes)
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native import checkpoint
from dynarl.components.trainer.native.adamw import adamw_update
from dynarl.components.trainer.native.losses import entropy_from_logprobs, micro_batch_loss, step_advantages
from dynarl.components.trainer.native.micro_batch import MicroBatch, build_micro_batch
from dynarl.components.trainer.native.sharding import flatten, param_pieces, shard_ranges, unflatten_into

__all__ = ["NativeTrainer", "TrainerConfig"]


class NativeTrainer:
    """One data-parallel rank. Collective methods (train_step, import_state_shard,
    save/load_checkpoint, and the constructor, which broadcasts rank 0's weights)
    must be called on every rank of `process_group`."""
    frees_offloaded_state = False
    """(trainer/base.py TrainerEngine)"""

    TERMS: tuple[str, ...] = ("loss", "pg_loss", "kl", "entropy", "clip_frac")
    """The loss terms a step reports (token-means over the global batch; TrainMetrics fields)."""

    def __init__(self, model: torch.nn.Module, config: TrainerConfig,
                 process_group: dist.ProcessGroup | None = None) -> None:
        self.model = model
        self.config = config
        self.group = process_group
        self.rank = process_group.rank() if process_group is not None else 0
        self.world_size = process_group.size() if process_group is not None else 1
        self.global_step = 0
        named = list(model.named_parameters())  # tied weights appear once
        if not named:
            raise ValueError("model has no parameters")
        self._names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self.device = self._params[0].device
        self._numels = [p.numel() for p in self._params]
        self._offsets = [0, *itertools.accumulate(self._numels)][:-1]
        total = sum(self._numels)
        ranges = tuple(shard_ranges(total, self.world_size))
        specs = tuple(ParamSpec(n, tuple(p.shape), str(p.dtype).removeprefix("torch."), o)
                      for n, p, o in zip(self._names, self._params, self._offsets))
        self._layout = StateLayout(params=specs, total_numel=total, world_size=self.world_size,
                                   shards={s: ranges for s in STATE_NAMES})
        self._start, self._end = ranges[self.rank]
        # Replicas must start identical, as DDP does: rank 0's weights win.
        full = flatten(self._params, self._numels, device=self.device)
        if self.world_size > 1:
            dist.broadcast(full, group_src=0, group=self.group)
            self._write_params(full)
        size = self._end - self._start
        self._state = {"master": full[self._start:self._end].clone()}
        for name in ("exp_avg", "exp_avg_sq", "grad"):
            self._state[name] = torch.zeros(size, dtype=torch.float32, device=self.device)
        # Weight decay applies to matrices only (not biases or norm scales).
        self._decay_segments = [(self._offsets[i] + lo - self._start, self._offsets[i] + hi - self._start)
                                for i, lo, hi in param_pieces(self._offsets, self._numels, self._start, self._end)
                                if self._params[i].dim() >= 2]
        self._rng_state = torch.Generator().manual_seed(config.seed + self.rank).get_state()
        self._onloaded = True
        self._pending: dict | None = None
        """Streaming: the loss tokens and metric sums accumulated since the last step."""

    # ---- training ---------------------------------------------------------------

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """Collective. One AdamW step on this rank's part of the global batch (see
        `TrainBatch.shard`). Loss is the token-mean over the whole global batch."""
        advantages = self._advantages(batch)
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before train_step()")
        num_tokens = int(self._all_reduce(torch.tensor([float(batch.num_loss_tokens())],
                                                       dtype=torch.float64, device=self.device)).item())
        if num_tokens == 0:
            raise ValueError("the global batch has no response tokens with mask 1")
        for p in self._params:
            p.grad = None
        return self._step(self._backward(batch, advantages, num_tokens), num_tokens)

    def accumulate(self, batch: TrainBatch) -> None:
        """Streaming gradient accumulation: forward/backward of one part of this step's
        batch (advantages precomputed: `batch.advantages`, or whole groups), its loss
        terms summed over tokens; `apply` divides by the step's global token count,
        so the step equals one train_step over all the parts. Not collective."""
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before accumulate()")
        if self._pending is None:
            self._pending = {"tokens": 0, "sums": self._zero_terms()}
            for p in self._params:
                p.grad = None
        self._pending["tokens"] += batch.num_loss_tokens()
        self._pending["sums"] += self._backward(batch, self._advantages(batch), 1)

    def apply(self) -> TrainMetrics:
        """Collective. The optimizer step over every part accumulated since the last
        step, on every rank (one that took no part joins with zero gradients)."""
        pending = self._pending or {"tokens": 0, "sums": self._zero_terms()}
        self._pending = None
        num_tokens = int(self._all_reduce(torch.tensor([float(pending["tokens"])], dtype=torch.float64,
                                                       device=self.device)).item())
        if num_tokens == 0:
            raise ValueError("the step accumulated no response tokens with mask 1 on any rank")
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            else:
                p.grad.div_(num_tokens)
        return self._step(pending["sums"] / num_tokens, num_tokens)

    def _step(self, sums: torch.Tensor, num_tokens: int) -> TrainMetrics:
        """The optimizer step on the gradients in the parameters; the global metrics."""
        grad_norm = self._update()
        self._all_reduce(sums)
        self.global_step += 1
        terms: dict[str, Any] = dict(zip(self.TERMS, sums.tolist()))
        return TrainMetrics(**terms, grad_norm=grad_norm, tokens=num_tokens, step=self.global_step)

    def _advantages(self, batch: TrainBatch) -> list:
        """What the loss of `batch` weighs its tokens by: GRPO's (or the batch's own) advantages."""
        return step_advantages(batch, self.config)

    def _zero_terms(self) -> torch.Tensor:
        return torch.zeros(len(self.TERMS), dtype=torch.float64, device=self.device)

    def _backward(self, batch: TrainBatch, advantages: Sequence[Any], num_tokens: int) -> torch.Tensor:
        """Forward/backward of `batch` micro-batch by micro-batch, the loss divided by
        `num_tokens`; gradients add up in the parameters. Returns the loss terms' sums."""
        cfg = self.config
        self.model.train()
        sums = self._zero_terms()
        with self._own_rng():
            for start in range(0, len(batch), cfg.micro_batch_size):
                rows = range(start, min(start + cfg.micro_batch_size, len(batch)))
                mb = build_micro_batch(batch, advantages, rows, self.device)
                if mb.num_tokens:
                    sums += self._forward_backward(mb, num_tokens)
        return sums

    def _forward_backward(self, mb: MicroBatch, num_tokens: int) -> torch.Tensor:
        """Backward of this micro-batch's share of the global token-mean loss;
        returns its (loss, pg, kl, entropy, clip_frac) shares."""
        cfg = self.config
        logits = self.model(mb.input_ids, attention_mask=mb.attention_mask)
        # Position t predicts token t + 1; keep only the positions in the loss.
        logp = torch.log_softmax(logits[:, :-1][mb.loss_mask].float(), dim=-1)
        logprobs = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        with torch.set_grad_enabled(cfg.entropy_coef > 0):
            entropy = entropy_from_logprobs(logp)
        terms = micro_batch_loss(logprobs, entropy, mb, cfg, num_tokens)
        terms.loss.backward()
        return torch.stack([t.detach().double() for t in terms])

    def _update(self) -> float:
        """Reduce gradients, clip by the global norm, AdamW on the owned range,
        all-gather the new weights. Returns the pre-clip global grad norm. A norm that
        is not finite leaves the state as it was (on every rank: the norm is global):
        the update would turn the weights and both moments to nan for good, and the
        workflow decides whether the run stops or goes on (trainer.nonfinite)."""
        cfg = self.config
        flat = flatten([p.grad for p in self._params], self._numels, device=self.device)
        for p in self._params:
            p.grad = None
        grad = self._reduce_scatter(flat)
        del flat
        sumsq = torch.sum(grad * grad, dtype=torch.float64).reshape(1)
        grad_norm = float(self._all_reduce(sumsq).sqrt().item())
        if not math.isfinite(grad_norm):
            return grad_norm
        self._state["grad"].copy_(grad)  # kept pre-clip: the summed gradient of this step
        if cfg.grad_clip > 0:
            coef = cfg.grad_clip / (grad_norm + 1e-6)
            if coef < 1.0:
                grad = grad * coef
        adamw_update(self._state["master"], grad, self._state["exp_avg"], self._state["exp_avg_sq"],
                     step=self.global_step + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay, decay_segments=self._decay_segments)
        self._write_params(self._all_gather(self._state["master"]))
        return grad_norm

    # ---- state ------------------------------------------------------------------

    def layout(self) -> StateLayout:
        return self._layout

    def export_state_shard(self) -> dict[str, torch.Tensor]:
        """This rank's owned range of every state in STATE_NAMES (fp32, flat) and
        'step' (int64 [1]). The tensors are views of live state: copy them before
        the next train_step if they must outlive it."""
        shard = {name: t.detach() for name, t in self._state.items()}
        shard["step"] = torch.tensor([self.global_step], dtype=torch.int64)
        return shard

    def import_state_shard(self, shard: Mapping[str, torch.Tensor]) -> None:
        """Collective. Install a shard covering exactly this rank's range (same keys
        as export_state_shard), then all-gather the master ranges into full weights."""
        size = self._end - self._start
        for name in (*STATE_NAMES, "step"):
            if name not in shard:
                raise ValueError(f"state shard lacks {name!r}")
        for name in STATE_NAMES:
            if shard[name].numel() != size:
                raise ValueError(f"state shard {name!r} has {shard[name].numel()} elements, "
                                 f"rank {self.rank} owns {size}")
            self._state[name].copy_(shard[name].reshape(-1))
        self.global_step = int(shard["step"].reshape(-1)[0])
        self._write_params(self._all_gather(self._state["master"]))

    def save_checkpoint(self, path: str) -> None:
        """Collective. Each rank writes its shard (and its RNG state); rank 0 writes
        meta.json. Returns once every rank's file is complete."""
        tensors = {**self.export_state_shard(), "rng_state": self._rng_state}
        checkpoint.save_shard(path, self.rank, self.world_size, tensors)
        if self.rank == 0:
            checkpoint.save_meta(path, self._layout, self.config.to_wire(), self.global_step)
        self._all_reduce(torch.zeros(1, device=self.device))  # barrier

    def load_checkpoint(self, path: str) -> None:
        """Collective. Load a checkpoint written by any world size: each rank reads
        the slices of the old shard files that cover its own range."""
        old, meta = checkpoint.load_meta(path)
        mine = [(p.name, p.shape) for p in self._layout.params]
        theirs = [(p.name, p.shape) for p in old.params]
        if mine != theirs:
            diff = next((a, b) for a, b in zip(mine + [None], theirs + [None]) if a != b)
            raise ValueError(f"checkpoint {path} does not match the model: ours {diff[0]}, checkpoint {diff[1]}")
        shard = {s: checkpoint.read_flat_range(path, old, s, self._start, self._end) for s in STATE_NAMES}
        shard["step"] = torch.tensor([meta["step"]])
        rng = checkpoint.read_tensor(path, self.rank, old.world_size, "rng_state")
        if rng is not None:
            self._rng_state = rng
        self.import_state_shard(shard)

    # ---- weights for rollout; device residency -----------------------------------

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Every parameter once, in layout order, in buckets of at most `bucket_bytes`
        (a parameter larger than that gets a bucket of its own). The tensors are
        detached views of the live weights."""
        yield from bucket_by_bytes(((n, p.detach()) for n, p in zip(self._names, self._params)), bucket_bytes)

    def offload(self) -> None:
        """Move weights and optimizer state to CPU (device_lock release)."""
        self._move_to(torch.device("cpu"))
        self._onloaded = False
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Move weights and optimizer state back to the training device."""
        self._move_to(self.device)
        self._onloaded = True

    @property
    def is_onloaded(self) -> bool:
        return self._onloaded

    def close(self) -> None:
        """Nothing beyond its tensors."""

    def _move_to(self, device: torch.device) -> None:
        self.model.to(device)  # keeps the Parameter objects, so self._params stays valid
        pin = device.type == "cpu" and self.device.type == "cuda"
        for name, t in self._state.items():
            moved = t.to(device)
            self._state[name] = moved.pin_memory() if pin else moved

    # ---- collectives over the group ---------------------------------------------

    def _all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            dist.all_reduce(t, group=self.group)
        return t

    def _reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        """Sum over ranks of `flat`, returning only this rank's range. Ranges differ
        by at most one element, so shorter ones are padded to the longest."""
        if self.world_size == 1:
            return flat
        ranges = self._layout.shards["grad"]
        chunk = max(e - s for s, e in ranges)
        inputs = [_padded(flat[s:e], chunk) for s, e in ranges]
        out = torch.empty(chunk, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter(out, inputs, group=self.group)
        return out[:self._end - self._start]

    def _all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The full flat vector from every rank's range of it."""
        if self.world_size == 1:
            return shard
        ranges = self._layout.shards["master"]
        chunk = max(e - s for s, e in ranges)
        outs = [torch.empty(chunk, dtype=shard.dtype, device=shard.device) for _ in ranges]
        dist.all_gather(outs, _padded(shard, chunk), group=self.group)
        return torch.cat([o[:e - s] for o, (s, e) in zip(outs, ranges)])

    def _write_params(self, full: torch.Tensor) -> None:
        with torch.no_grad():
            unflatten_into(full, self._params, self._offsets)

    @contextlib.contextmanager
    def _own_rng(self) -> Iterator[None]:
        """Run with the trainer's CPU RNG stream (dropout), leaving the caller's intact;
        the stream is saved in checkpoints so a resumed run draws the same numbers."""
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state)
            yield
            self._rng_state = torch.get_rng_state()


def _padded(t: torch.Tensor, size: int) -> torch.Tensor:
    if t.numel() == size:
        return t.contiguous()
    return torch.cat([t, t.new_zeros(size - t.numel())])
