"""The megatron-core trainer: GRPO on a GPTModel shaped like the native decoder
(model.py), tensor x data parallel, megatron DDP and (by default) its distributed
optimizer.

One instance per rank. It needs torch.distributed's default group (the worker
starts with torchrun's environment) and builds megatron's parallel_state from
MegatronConfig if nobody did. A step, on every rank:

    forward/backward over micro-batches    loss = token sums / the *global* token count,
                                           log-probs from vocab-sharded logits
    finalize_model_grads()                 calculate_per_token_loss: DP *sums* gradients;
                                           Qwen3's q/k norm gradients summed over TP
    optimizer.step()                       clip, Adam; returns the pre-clip grad norm

The loss math is the native trainer's (losses.grpo_loss on the same micro-batches,
its rollout correction, algorithm.rollout_correction, included), so both backends
train the same objective; tests check the gradients agree.
Pipeline parallelism is not implemented for training (MegatronConfig refuses it).

The optimizer is megatron-core's (GPU; core_optimizer.CoreOptimizer exports its
state, a flat range of each parameter per DP rank under the distributed optimizer)
or, with MegatronConfig.optimizer="adamw", adamw.LocalAdamW (runs on CPU too).
Either one's state reshards live and goes into checkpoints (checkpoint.py).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist

from dynarl.components.extras import require_extra
from dynarl.components.model.config import ModelConfig
from dynarl.components.trainer.base import TrainBatch, TrainerConfig
from dynarl.components.trainer.lr_schedule import lr_at
from dynarl.components.trainer.metrics import TrainMetrics
from dynarl.components.trainer.native.losses import GRPOLoss, micro_batch_loss, step_advantages
from dynarl.components.trainer.native.micro_batch import MicroBatch, build_micro_batch
from dynarl.components.trainer.megatron import checkpoint
from dynarl.components.trainer.megatron.adamw import LocalAdamW
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.trainer.megatron.core_optimizer import CoreOptimizer
from dynarl.components.trainer.megatron.layout import ShardedLayout
from dynarl.components.trainer.megatron.model import build_gpt_model, causal_mask
from dynarl.components.trainer.megatron.sharded_state import gather_layout, rank_pieces
from dynarl.components.trainer.megatron.vocab_parallel import vocab_parallel_logprobs
from dynarl.components.trainer.megatron.weights import hf_buckets, load_hf_weights
from dynarl.components.trainer.world import leave_default_group

OptimizerFactory = Callable[[Any, TrainerConfig, MegatronConfig], Any]
"""(DDP model, configs) -> an object with megatron's optimizer interface: zero_grad(),
step() -> (success, grad_norm, num_zeros), offload_to_cpu(), restore_from_cpu(),
param_groups (dicts with "lr"). With state_tensors(), load_state_tensors(),
owned_ranges() and weights_loaded() as well (adamw.LocalAdamW,
core_optimizer.CoreOptimizer) the trainer exports its state, reshards and writes
checkpoints."""


def megatron_optimizer(ddp_model: Any, config: TrainerConfig, megatron: MegatronConfig) -> CoreOptimizer:
    """megatron's Adam (decoupled weight decay, none on biases and norms, like the
    native trainer), distributed over data parallel when configured."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    bf16 = megatron.dtype == "bfloat16"
    return CoreOptimizer(get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=config.lr, min_lr=config.lr, weight_decay=config.weight_decay,
        adam_beta1=config.betas[0], adam_beta2=config.betas[1], adam_eps=config.eps,
        clip_grad=config.grad_clip, bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_distributed_optimizer=megatron.use_distributed_optimizer), [ddp_model]),
        ddp_model.module, keep_main=megatron.dtype != "float32")


class MegatronTrainer:
    """Collective methods (train_step, layout, named_weights and the constructor) must
    be called on every rank."""
    frees_offloaded_state = True
    """(trainer/engine.py TrainerEngine)"""

    def __init__(self, model_config: ModelConfig, config: TrainerConfig, megatron: MegatronConfig, *,
                 hf_weights: Mapping[str, torch.Tensor] | None = None,
                 optimizer_factory: OptimizerFactory | None = None) -> None:
        if config.objective != "grpo":  # (the config refuses others with trainer.backend megatron)
            raise ValueError(f"the megatron trainer trains objective grpo only, not {config.objective!r}")
        require_extra("megatron")
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        if not dist.is_initialized():
            raise RuntimeError("MegatronTrainer needs torch.distributed's default group (init_process_group)")
        self.model_config, self.config, self.megatron = model_config, config, megatron
        tp, pp = megatron.tensor_parallel_size, megatron.pipeline_parallel_size
        if not parallel_state.model_parallel_is_initialized():
            parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
        elif (parallel_state.get_tensor_model_parallel_world_size(),
              parallel_state.get_pipeline_model_parallel_world_size()) != (tp, pp):
            raise RuntimeError(f"parallel_state is initialized with another layout than tp={tp}, pp={pp}")
        tensor_parallel.model_parallel_cuda_manual_seed(megatron.seed)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self._dp_group = parallel_state.get_data_parallel_group()
        self.global_step = 0

        self.model = build_gpt_model(model_config, megatron, config.activation_checkpointing)
        if torch.cuda.is_available():
            self.model.cuda(torch.cuda.current_device())
        self.device = next(self.model.parameters()).device
        if hf_weights is not None:
            load_hf_weights(self.model, hf_weights, model_config)
        self.ddp = DistributedDataParallel(
            config=self.model.config, module=self.model,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=megatron.grad_reduce_in_fp32, overlap_grad_reduce=False,
                use_distributed_optimizer=megatron.use_distributed_optimizer, bucket_size=megatron.ddp_bucket_size))
        self.ddp.broadcast_params()  # data-parallel replicas start identical, as the native trainer's do
        if optimizer_factory is None:
            optimizer_factory = LocalAdamW if megatron.optimizer == "adamw" else megatron_optimizer
        self.optimizer = optimizer_factory(self.ddp, config, megatron)
        self._layout: ShardedLayout | None = None
        self._onloaded = True
        self._cpu_params: dict[str, torch.Tensor] = {}

    # ---- training ---------------------------------------------------------------

    def train_step(self, batch: TrainBatch) -> TrainMetrics:
        """Collective. One optimizer step on this rank's part of the global batch: the
        caller passes `batch.shard(dp_rank, dp_size)`; TP ranks of one DP rank get the
        same part. Metrics are global and equal on every rank."""
        from megatron.core.distributed import finalize_model_grads

        cfg = self.config
        if not self._onloaded:
            raise RuntimeError("trainer is offloaded; call onload() before train_step()")
        advantages = step_advantages(batch, cfg)
        count = torch.tensor([float(batch.num_loss_tokens())], dtype=torch.float64, device=self.device)
        num_tokens = int(self._dp_sum(count).item())
        if num_tokens == 0:
            raise ValueError("the global batch has no response tokens with mask 1")
        self.ddp.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        sums = torch.zeros(len(GRPOLoss._fields), dtype=torch.float64, device=self.device)
        for start in range(0, len(batch), cfg.micro_batch_size):
            rows = range(start, min(start + cfg.micro_batch_size, len(batch)))
            mb = build_micro_batch(batch, advantages, rows, self.device)
            if mb.num_tokens:
                sums += self._forward_backward(mb, num_tokens)
        finalize_model_grads([self.ddp])
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(self.global_step, cfg)  # (the warm start swaps in its own config)
        success, grad_norm, _ = self.optimizer.step()
        self._dp_sum(sums)
        self.global_step += 1
        loss, pg_loss, kl, entropy, clip_frac, capped = sums.tolist()
        return TrainMetrics(loss=loss, pg_loss=pg_loss, kl=kl, entropy=entropy, clip_frac=clip_frac,
                            rollout_capped_frac=capped,
                            grad_norm=float(grad_norm if grad_norm is not None else float("nan")),
                            tokens=num_tokens, step=self.global_step, update_skipped=not success)

    def begin_stream(self) -> None:
        raise NotImplementedError("the megatron trainer steps on whole batches: set trainer.streaming false")

    def accumulate(self, batch: TrainBatch) -> None:
        """Streaming is the native trainer's (the config refuses trainer.streaming here)."""
        raise NotImplementedError("the megatron trainer steps on whole batches: set trainer.streaming false")

    def apply(self) -> TrainMetrics:
        raise NotImplementedError("the megatron trainer steps on whole batches: set trainer.streaming false")

    def _forward_backward(self, mb: MicroBatch, num_tokens: int) -> torch.Tensor:
        cfg = self.config
        batch_size, length = mb.input_ids.shape
        positions = torch.arange(length, device=self.device).expand(batch_size, length)
        logits = self.ddp(mb.input_ids, positions, causal_mask(length, self.device))  # [b, s, V/tp]
        # position t predicts token t + 1; keep only the positions in the loss
        logprobs, entropy = vocab_parallel_logprobs(logits[:, :-1][mb.loss_mask], mb.targets,
                                                    entropy_grad=cfg.entropy_coef > 0)
        terms = micro_batch_loss(logprobs, entropy, mb, cfg, num_tokens)
        terms.loss.backward()
        return torch.stack([t.detach().double() for t in terms])

    @torch.no_grad()
    def full_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Collective over TP. Logits [b, s, vocab] of right-padded input_ids (all ranks get them)."""
        from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

        self.ddp.eval()
        batch_size, length = input_ids.shape
        positions = torch.arange(length, device=self.device).expand(batch_size, length)
        logits = self.ddp(input_ids.to(self.device), positions, causal_mask(length, self.device))
        return gather_from_tensor_model_parallel_region(logits)

    def _dp_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.dp_size > 1:
            dist.all_reduce(t, group=self._dp_group)
        return t

    # ---- state ------------------------------------------------------------------

    def layout(self) -> ShardedLayout:
        """Collective over the world. Where every box of every weight lives (cached:
        the layout is fixed for the trainer's lifetime)."""
        if self._layout is None:
            owned = self.optimizer.owned_ranges() if hasattr(self.optimizer, "state_tensors") else None
            self._layout = gather_layout(rank_pieces(self.model, owned), self.megatron.tensor_parallel_size,
                                         self.megatron.pipeline_parallel_size)
        return self._layout

    def local_weights(self) -> dict[str, torch.Tensor]:
        """This rank's parameters by local name (what a layout's Piece.param names): live
        views, for executing a reshard plan's copies."""
        self._require_onloaded("its weights")
        return {name: p.detach() for name, p in self.model.named_parameters()}

    def named_weights(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Collective over TP. Full weights with HF names for the rollout engines, in
        buckets of at most bucket_bytes; every TP rank gets the same buckets. In
        float32 whatever the model's dtype (the sync casts each bucket to the receivers'
        dtype, model.dtype); each TP rank holds them whole meanwhile."""
        self._require_onloaded("its weights for a sync")
        return hf_buckets(self.model, self.model_config, bucket_bytes, dtype=torch.float32)

    def export_state_shard(self) -> dict[str, Any]:
        """This rank's weights ("param/<local name>", its TP slice), optimizer state and
        "step": live views, copy them before the next train_step if they must outlive it."""
        self._require_onloaded("its state")
        state = self._stateful("export_state_shard").state_tensors()
        shard = {f"param/{name}": w for name, w in self.local_weights().items()}
        shard.update(state)
        shard["step"] = torch.tensor([self.global_step], dtype=torch.int64)
        return shard

    def import_state_shard(self, shard: Mapping[str, Any]) -> None:
        """Install a shard exported by the rank at the same place in the same layout."""
        self._stateful("import_state_shard")
        params = dict(self.model.named_parameters())
        missing = [n for n in params if f"param/{n}" not in shard]
        if missing:
            raise ValueError(f"state shard lacks the weights {missing[:4]}")
        for name, p in params.items():
            if tuple(shard[f"param/{name}"].shape) != tuple(p.shape):
                raise ValueError(f"param/{name}: shape {tuple(shard[f'param/{name}'].shape)}, "
                                 f"this rank holds {tuple(p.shape)}")
        self.optimizer.load_state_tensors({k: v for k, v in shard.items() if not k.startswith("param/")})
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(shard[f"param/{name}"].to(dtype=p.dtype, device=p.device))
        self.optimizer.weights_loaded()
        self.global_step = int(shard["step"].reshape(-1)[0])

    def save_checkpoint(self, path: str) -> None:
        """Collective. Every rank writes its own file; rank 0 the layout (see checkpoint.py)."""
        self._require_onloaded("a checkpoint of it")
        shard = self.export_state_shard()
        checkpoint.save(path, self.rank, self.world_size, shard,
                        {**self._checkpoint_layout(), "step": self.global_step, "config": self.config.to_wire(),
                         "layout": self.layout().to_wire()})
        dist.barrier()

    def load_checkpoint(self, path: str) -> None:
        """Collective. A checkpoint of any TP x DP layout of the same model and dtype."""
        meta = checkpoint.read_meta(path)
        mine = self._checkpoint_layout()
        if meta.get("dtype") != mine["dtype"]:
            raise ValueError(f"checkpoint {path} holds {meta.get('dtype')} weights, this trainer {mine['dtype']}")
        if checkpoint.same_layout(meta, mine) and meta["layout"].get("flat", []) == self.layout().to_wire()["flat"]:
            tensors = checkpoint.read_own(path, self.rank, self.world_size)
        else:  # what this rank holds: its kinds and their shapes
            shapes = {k: (tuple(t.shape), t.dtype) for k, t in self.export_state_shard().items() if "/" in k}
            tensors = checkpoint.read_resharded(path, meta, self.layout(), self.rank, shapes)
        self.import_state_shard(tensors)
        dist.barrier()

    def close(self) -> None:
        """Leave megatron's parallel state and the default group (a retired rank: a later
        trainer in this process, e.g. at another TP x DP, builds its own)."""
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        leave_default_group()

    def _checkpoint_layout(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "tensor_parallel_size": self.megatron.tensor_parallel_size,
                "pipeline_parallel_size": self.megatron.pipeline_parallel_size, "dtype": self.megatron.dtype}

    def _stateful(self, what: str) -> Any:
        if not hasattr(self.optimizer, "state_tensors"):
            raise NotImplementedError(f"{what}: this optimizer ({type(self.optimizer).__name__}) exports no state")
        return self.optimizer

    # ---- device residency (device_lock) ------------------------------------------

    def offload(self) -> None:
        """Free device memory: weights, gradient buffers and optimizer state go to CPU.
        On a CPU-only run there is nothing to free; the trainer only refuses to train."""
        if self.device.type == "cuda":
            self.optimizer.offload_to_cpu()
            self.ddp.offload_grad_buffers()
            self._move_params(to_cpu=True)
            torch.cuda.empty_cache()
        self._onloaded = False

    def onload(self) -> None:
        if self.device.type == "cuda":
            self._move_params(to_cpu=False)
            self.ddp.restore_grad_buffers()
            self.optimizer.restore_from_cpu()
        self._onloaded = True

    @property
    def is_onloaded(self) -> bool:
        return self._onloaded

    def _require_onloaded(self, what: str) -> None:
        """Offloaded, the weights' and optimizer's device storage is freed (on a GPU; the
        same is refused on a CPU, where offload keeps it, so the tests see what a GPU
        would): reading them gives nothing. The trainer worker onloads around such
        reads (reshard.on_device)."""
        if not self._onloaded:
            raise RuntimeError(f"read of {what} while the megatron trainer is offloaded: onload() first")

    def _move_params(self, to_cpu: bool) -> None:
        """The distributed optimizer keeps the weights in DDP's contiguous param buffers
        (offloaded whole); without it they are plain parameters, moved one by one."""
        buffers = self.ddp.buffers + self.ddp.expert_parallel_buffers
        if all(b.param_data is not None for b in buffers):
            for b in buffers:
                if to_cpu:
                    b.offload_to_cpu(move_params=True, move_grads=False)
                else:
                    b.reload_from_cpu(move_params=True, move_grads=False)
            return
        for name, p in self.model.named_parameters():
            if to_cpu:
                self._cpu_params[name] = p.data.to("cpu", non_blocking=True).pin_memory()
                p.data = torch.empty(0, dtype=p.dtype, device=self.device)
            else:
                p.data = self._cpu_params.pop(name).to(self.device, non_blocking=True)
