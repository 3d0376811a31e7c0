"""What one rank of each engine holds on its device, by part and by phase.

A rank's `Footprint` has three parts lists (name -> bytes):

    held     what it keeps on the device between its own phases (parked)
    working  what it adds while its own phase runs (rollout, inference or train)
    sync     what it adds during a weight sync (a bucket in flight; weights onloaded)

Each engine's formulas follow its code and the sources in formulas.py; docs/memory.md
lists them. Pure functions of the config, the model's shape and the device kind: on a
GPU the engines are bf16 and an offloaded engine holds nothing on the device; on CPU
logical devices the native engines are float32 and offloading frees nothing (the
"device" is host memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dynarl.components.model.config import ModelConfig

from dynarl.components.memory import formulas as f

CUDA_CONTEXT_BYTES = 500 * 2**20
"""A process's CUDA context and the kernels torch loads (about 500 MiB on Hopper,
outside torch's allocator) [E, docs/memory.md]. 0 on CPU devices."""
DEFAULT_SGLANG_FRACTION = 0.88
"""mem_fraction_static when the config leaves it to SGLang: its own choice for an
80 GB GPU at TP 1 (sglang server_args: about 0.88 on H100) [E, docs/memory.md]."""
DEFAULT_VLLM_UTILIZATION = 0.9
"""vLLM's default gpu_memory_utilization (vllm EngineArgs) [P]."""


@dataclass(frozen=True, slots=True)
class Footprint:
    component: str
    """rollout | inference | trainer | standby: the phase in which `working` applies."""
    rank: int
    devices: tuple[int, ...]
    """The devices the rank spans (an SGLang engine at TP k spans k); bytes are per device."""
    held: dict[str, int] = field(default_factory=dict)
    working: dict[str, int] = field(default_factory=dict)
    sync: dict[str, int] = field(default_factory=dict)
    engine: str = ""


@dataclass(frozen=True, slots=True)
class Shape:
    """What the engines' formulas read besides the model: the device and the sizes."""
    device_kind: str
    """cuda | cpu"""
    device_bytes: int
    seq_len: int
    """The longest sequence planned: prompt + response tokens."""

    @property
    def gpu(self) -> bool:
        return self.device_kind == "cuda"

    @property
    def native_dtype_bytes(self) -> int:
        return 2 if self.gpu else 4

    @property
    def context(self) -> dict[str, int]:
        return {"cuda context": CUDA_CONTEXT_BYTES} if self.gpu else {}


def native_trainer(cfg: Any, m: ModelConfig, s: Shape, world: int) -> tuple[dict, dict]:
    """held, working of one native (ZeRO-1) trainer rank of `world` ranks.

    held: the weights in the model dtype and the 16-byte ZeRO-1 shard (master, two
    moments, reduced gradient) over `world`. working: the larger of
      backward   the gradients (model dtype) and a micro-batch's activations;
      step       the flat fp32 gradient of every parameter (4P) beside either the
                 per-parameter gradients it is flattened from, or the reduced range's
                 clipped copy and AdamW's two temporaries (3 ranges; with one rank the
                 flat gradient is the range), trainer/native/trainer.py `_update`,
                 adamw.py."""
    p, d = m.num_parameters, s.native_dtype_bytes
    held = {"weights": f.weight_bytes(m, d), "optimizer state": f.NATIVE_STATE_BYTES * p // world}
    mb = cfg.trainer.engine.micro_batch_size
    activations = (m.num_hidden_layers * f.layer_activation_bytes(m, mb * s.seq_len, d)
                   + native_loss_bytes(m, mb * s.seq_len, mb * cfg.rollout.max_new_tokens, d))
    if world == 1:  # the flat gradient is the range: beside it the clipped copy and two temporaries
        step = 4 * p + max(d * p, 12 * p)
    else:  # flatten, reduce-scatter into the range, then (flat freed) range, clipped copy, two temporaries
        step = max(4 * p + d * p, 4 * p + 4 * p // world, 16 * p // world)
    if d * p + activations >= step:
        return held, {"gradients": d * p, "activations": activations}
    return held, {"optimizer step": step}


def native_loss_bytes(m: ModelConfig, tokens: int, loss_tokens: int, d: int) -> int:
    """The [positions, vocab] tensors the native loss holds at its peak, in the
    backward (trainer.py `_forward_backward`): at every position the logits and their
    gradient (model dtype); at the loss positions (the responses) the gathered logits
    and their gradient (model dtype), log_softmax's fp32 output and its gradient, and
    under bf16 the fp32 copy and its gradient. Measured on CPU (`dynarl bench
    memory`): the entropy term's tensors do not raise the peak."""
    per_loss = 2 * d + 8 + 8 * (d != 4)
    return m.vocab_size * (2 * d * tokens + per_loss * loss_tokens)


def megatron_trainer(cfg: Any, m: ModelConfig, s: Shape, world: int) -> tuple[dict, dict]:
    """held, working of one megatron-core rank: TP t, DP n = world / t.

    Bytes per parameter after megatron's distributed-optimizer guide (docs/source/
    api-guide/dist_optimizer.md): bf16 weights and fp32 gradients 2 + 4, and 12 for
    the fp32 main weights and Adam's moments, divided by n with the distributed
    optimizer ("6 + 12/d"); fp32 weights need no main copy (4 + 4 + 8). All of it over
    t. Activations: formulas.activation_bytes at t, bf16 (flash attention)."""
    from dynarl.components.trainer.megatron.config import MegatronConfig

    mc = cfg.trainer.megatron or MegatronConfig()  # (the backend's defaults, as engine_factory builds it)
    t = mc.tensor_parallel_size
    n = max(1, world // t)
    d = f.DTYPE_BYTES[mc.dtype]
    p = m.num_parameters
    opt = (f.ADAM_BYTES if d < 4 else 8) * p // t
    grad_bytes = 4 if (mc.grad_reduce_in_fp32 or d == 4) else d
    held = {"weights": f.weight_bytes(m, d, t), "gradients": grad_bytes * p // t,
            "optimizer state": opt // n if mc.use_distributed_optimizer else opt}
    tokens = cfg.trainer.engine.micro_batch_size * s.seq_len
    return held, {"activations": f.activation_bytes(m, tokens, d, t)}


def native_rollout(cfg: Any, m: ModelConfig, s: Shape) -> tuple[dict, dict]:
    """The native engine: weights, and while it runs its paged KV cache (num_blocks x
    block_size tokens, released with the engine) and a prefill's activations (one
    layer's at a time under inference_mode, plus the logits of every running
    sequence)."""
    d = s.native_dtype_bytes
    e = cfg.rollout.engine
    kv = e.num_blocks * e.block_size * f.kv_bytes_per_token(m, d)
    prefill = f.layer_activation_bytes(m, e.max_prefill_tokens, d) + 4 * e.max_num_seqs * m.vocab_size
    return {"weights": f.weight_bytes(m, d)}, {"kv cache": kv, "activations": prefill}


def static_pool_rollout(cfg: Any, m: ModelConfig, s: Shape, fraction: float, tp: int, what: str
                        ) -> tuple[dict, dict]:
    """SGLang (mem_fraction_static) and vLLM (gpu_memory_utilization): the engine takes
    `fraction` of each device's memory for its weights and KV cache (SGLang's
    server_args: "fraction of the memory used for static allocation (model weights and
    KV cache memory pool)"; vLLM: "the fraction of GPU memory to be used for the model
    executor"). Released (device_lock, a moved device), the KV cache goes and the
    weights stay (SGLang's offload_tags without "weights")."""
    weights = f.weight_bytes(m, 2, tp)
    pool = int(fraction * s.device_bytes)
    return {"weights": weights}, {f"{what} (kv cache)": max(0, pool - weights)}


def native_inference(cfg: Any, m: ModelConfig, s: Shape) -> tuple[dict, dict]:
    """The native inference engine: policy weights (and the reference's with a KL
    term, a teacher's with algorithm.teacher), a no-grad forward of one micro-batch: one
    layer's activations and the logits, their fp32 copy and logsumexp's (inference/logprobs.py)."""
    d = s.native_dtype_bytes
    weights = {"weights": f.weight_bytes(m, d)}
    if cfg.with_ref:
        weights["reference weights"] = f.weight_bytes(m, d)
    if cfg.algorithm.teacher is not None:
        weights["teacher weights"] = f.weight_bytes(cfg.algorithm.teacher.config(), d)
    tokens = cfg.inference.micro_batch_size * s.seq_len
    act = f.layer_activation_bytes(m, tokens, d) + f.logits_bytes(m, tokens, d + 4 + 4 * (d != 4))
    return weights, {"activations": act}
