"""Cost model for the emulated backends: every constant in one place, sources beside them.

Tags follow docs/COSTMODEL.md: [P] primary source (paper or repository), [S]
secondary (abstract, summary, talk), [E] estimate derived here. Estimates are
to be replaced by GPU measurements when a run provides them.

The functions are pure: they take a ModelShape, a DeviceSpec and sizes, and
return seconds (or tokens). No I/O, no torch; the emulated engines and the
simulator call them every step, so they stay a handful of float operations.
"""
from __future__ import annotations

from dataclasses import dataclass

# --- decode (docs/COSTMODEL.md §3 "Decode step time") -------------------------------
DECODE_STEP_OVERHEAD_S = 2e-3
"""T0: scheduling, sampling and kernel launches per decode step [E, docs/COSTMODEL.md §3]."""
HBM_EFFICIENCY = 0.75
"""eta_m: achieved / peak HBM bandwidth while decoding [E, docs/COSTMODEL.md §3]."""
COMPUTE_EFFICIENCY = 0.5
"""eta_c: achieved / peak BF16 FLOP/s while decoding [E, docs/COSTMODEL.md §3]."""
TP_ALLREDUCE_PER_LAYER_S = 20e-6
"""Added per layer when TP > 1 (two small all-reduces per layer) [E, docs/COSTMODEL.md §3]."""

# --- prefill, training, log-probs (docs/COSTMODEL.md §3 "Other phases") ---------------
PREFILL_EFFICIENCY = 0.5
"""Fraction of peak BF16 FLOP/s a prefill reaches: 2P·N/(0.5·F·TP) [E, docs/COSTMODEL.md §3]."""
DEFAULT_MFU = 0.4
"""Training MFU; Megatron reaches up to 47% on H100 (Megatron-LM README) [P], 40% assumed [E]."""
LOGPROB_SPEEDUP = 3.0
"""A forward-only pass costs 1/3 of forward+backward: 2 vs 6 FLOPs per param·token [E, docs/COSTMODEL.md §3]."""
RECOMPUTE_RATE_FACTOR = 0.75
"""Full activation recompute multiplies the training rate by 3/4 [E, docs/COSTMODEL.md §3]."""

# --- memory -------------------------------------------------------------------
BYTES_PER_PARAM = 2
"""BF16 weights [docs/COSTMODEL.md §3 table: 3.1 / 15.2 / 65 GB]."""
DEFAULT_MEM_UTIL = 0.9
"""Fraction of device memory an inference engine claims (vLLM gpu_memory_utilization /
SGLang mem_fraction_static style) [E, docs/COSTMODEL.md §3 capacity row]."""
KV_RESERVE_BYTES_PER_DEVICE = 3e9
"""Per-device memory kept out of the KV pool (activations, CUDA graphs, NCCL buffers).
[E] inferred here: 3 GB is what makes (0.9·HBM·TP − weights − reserve·TP) / kv_bytes
reproduce docs/COSTMODEL.md's capacity row (2.3M / 0.94M / 0.28M TP2 / 0.80M TP4)."""

# --- weight sync and role switches (docs/COSTMODEL.md §3 "Weight sync") ---------------
ROLE_SWITCH_S = 2.0
"""Offload one role, onload another: RLinf <1 s (docs claim) [S], RollPacker ≤3 s [P];
midpoint of the 1–3 s model [E, docs/COSTMODEL.md §3]."""
ENGINE_RESTART_S = 10.0
"""Added to a role switch that restarts an engine (≥10 s) [E, docs/COSTMODEL.md §3]."""


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    num_params: int
    """P, embeddings included: every decode step reads them all, prefill/training FLOPs use 2P/6P."""
    num_non_embedding_params: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    """d in the attention FLOP terms (= num_attention_heads · head_dim for Qwen2.5)."""
    vocab_size: int
    intermediate_size: int
    """MLP width; with the fields above it fixes every parameter's shape (emulated trainer layout)."""
    tie_word_embeddings: bool

    @property
    def weight_bytes(self) -> int:
        return BYTES_PER_PARAM * self.num_params

    @property
    def kv_bytes_per_token(self) -> int:
        # K and V, per layer, per KV head, head_dim values of 2 bytes.
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * BYTES_PER_PARAM


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    name: str
    memory_bytes: float
    hbm_bandwidth: float
    """Bytes/s, peak."""
    bf16_flops: float
    """FLOP/s, dense BF16 peak."""
    link_bandwidth: float
    """Bytes/s one direction between two devices of a node (weight sync within a node)."""
    nic_bandwidth: float
    """Bytes/s one direction across nodes (one NIC)."""


# Parameters, layers and heads: model cards, ZHUI/paddlenlp_model_readme
# Qwen/Qwen2.5-*/index.md [P]; hidden_size, vocab_size, intermediate_size and
# tie_word_embeddings: HF Qwen/Qwen2.5-*/config.json [P]. The cards' rounded parameter
# counts drive the cost; the exact architecture (32.76B for "32.5B") gives the trainer layout.
MODELS: dict[str, ModelShape] = {m.name: m for m in (
    ModelShape("qwen2.5-1.5b", 1_540_000_000, 1_310_000_000, num_layers=28, num_attention_heads=12,
               num_kv_heads=2, head_dim=128, hidden_size=1536, vocab_size=151_936,
               intermediate_size=8960, tie_word_embeddings=True),
    ModelShape("qwen2.5-7b", 7_610_000_000, 6_530_000_000, num_layers=28, num_attention_heads=28,
               num_kv_heads=4, head_dim=128, hidden_size=3584, vocab_size=152_064,
               intermediate_size=18_944, tie_word_embeddings=False),
    ModelShape("qwen2.5-32b", 32_500_000_000, 31_000_000_000, num_layers=64, num_attention_heads=40,
               num_kv_heads=8, head_dim=128, hidden_size=5120, vocab_size=152_064,
               intermediate_size=27_648, tie_word_embeddings=False),
)}

DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (
    # HBM 3.35 TB/s, 989 TFLOP/s BF16 dense (H100 SXM datasheet) [P via docs/COSTMODEL.md §3];
    # NVLink p2p measured ~380 GB/s one direction (NVIDIA/nccl issue #1264) [P];
    # one 400 Gb/s NIC = 50 GB/s (docs/COSTMODEL.md §3 weight-sync floor) [E].
    DeviceSpec("h100-80gb", memory_bytes=80e9, hbm_bandwidth=3.35e12, bf16_flops=989e12,
               link_bandwidth=380e9, nic_bandwidth=50e9),
    # H200 SXM: 141 GB HBM3e at 4.8 TB/s, same Hopper compute (989 TFLOP/s BF16 dense)
    # (NVIDIA H200 datasheet) [S]; same NVLink 4 and NIC as H100 [E].
    DeviceSpec("h200", memory_bytes=141e9, hbm_bandwidth=4.8e12, bf16_flops=989e12,
               link_bandwidth=380e9, nic_bandwidth=50e9),
    # A small CPU host, for comparing against the native engines on CPU [E]:
    # ~50 GB/s DRAM, ~1 TFLOP/s, 16 GB for the engine, ~10 GB/s shared-memory copies.
    DeviceSpec("cpu-tiny", memory_bytes=16e9, hbm_bandwidth=50e9, bf16_flops=1e12,
               link_bandwidth=10e9, nic_bandwidth=1.25e9),
)}


def get_model(name: str) -> ModelShape:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def get_device(name: str) -> DeviceSpec:
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}; known: {sorted(DEVICES)}")
    return DEVICES[name]


def decode_step_time(model: ModelShape, device: DeviceSpec, batch: int, mean_context: float,
                     tp: int = 1) -> float:
    """One decode iteration of `batch` sequences whose mean context is `mean_context` tokens.

    t = T0 + max(memory, compute) + 20 µs·layers·[TP>1], with
    memory  = (2P + B·L̄·kv_bytes) / TP / (eta_m·BW)   (weights once + every sequence's KV)
    compute = (2P·B + 4·layers·d·B·L̄) / (TP·eta_c·F)   (matmuls + attention)
    """
    if batch <= 0:
        return 0.0
    kv_bytes = batch * mean_context * model.kv_bytes_per_token
    memory = (model.weight_bytes + kv_bytes) / tp / (HBM_EFFICIENCY * device.hbm_bandwidth)
    flops = 2 * model.num_params * batch + 4 * model.num_layers * model.hidden_size * batch * mean_context
    compute = flops / (tp * COMPUTE_EFFICIENCY * device.bf16_flops)
    tp_overhead = TP_ALLREDUCE_PER_LAYER_S * model.num_layers if tp > 1 else 0.0
    return DECODE_STEP_OVERHEAD_S + max(memory, compute) + tp_overhead


def decode_steps_time(model: ModelShape, device: DeviceSpec, batch: int, mean_context: float,
                      num_steps: int, tp: int = 1) -> float:
    """sum_{j < num_steps} decode_step_time(batch, mean_context + j) in closed form: both
    terms of the max are linear in j, so the sum is one or two arithmetic series. This
    lets an emulated engine spend thousands of identical-batch steps in one sleep."""
    if batch <= 0 or num_steps <= 0:
        return 0.0
    mem_bw = tp * HBM_EFFICIENCY * device.hbm_bandwidth
    flops = tp * COMPUTE_EFFICIENCY * device.bf16_flops
    kv_step = batch * model.kv_bytes_per_token / mem_bw  # memory term's growth per step
    attn_step = 4 * model.num_layers * model.hidden_size * batch / flops
    mem0 = (model.weight_bytes + batch * mean_context * model.kv_bytes_per_token) / mem_bw
    comp0 = (2 * model.num_params * batch + 4 * model.num_layers * model.hidden_size * batch * mean_context) / flops
    fixed = DECODE_STEP_OVERHEAD_S + (TP_ALLREDUCE_PER_LAYER_S * model.num_layers if tp > 1 else 0.0)

    def series(start: float, growth: float, lo: int, hi: int) -> float:  # sum over j in [lo, hi)
        n = hi - lo
        return n * start + growth * (lo + hi - 1) * n / 2 if n > 0 else 0.0

    # The two lines cross at most once; before it the larger start wins.
    if (mem0 >= comp0) == (mem0 + kv_step * (num_steps - 1) >= comp0 + attn_step * (num_steps - 1)):
        split = num_steps
    else:
        split = min(num_steps, max(0, int((comp0 - mem0) / (kv_step - attn_step)) + 1))
    first, second = ((mem0, kv_step), (comp0, attn_step)) if mem0 >= comp0 else ((comp0, attn_step), (mem0, kv_step))
    return num_steps * fixed + series(*first, 0, split) + series(*second, split, num_steps)


def prefill_time(model: ModelShape, device: DeviceSpec, num_tokens: int, tp: int = 1) -> float:
    """Prompt pass over `num_tokens` new tokens: 2P·N / (0.5·F·TP). The attention term
    is left out, as in docs/COSTMODEL.md; it matters only for very long prompts."""
    return 2 * model.num_params * num_tokens / (PREFILL_EFFICIENCY * device.bf16_flops * tp)


def _flops_per_token(model: ModelShape, mean_seq_len: float, per_param: int) -> float:
    # per_param: 6 for forward+backward, 2 for a forward pass. Attention adds
    # per_param·layers·d·s̄ (docs/COSTMODEL.md §3 training formula).
    return per_param * model.num_params + per_param * model.num_layers * model.hidden_size * mean_seq_len


def train_time(model: ModelShape, device: DeviceSpec, num_tokens: int, mean_seq_len: float,
               num_devices: int, mfu: float = DEFAULT_MFU, recompute: bool = False) -> float:
    """Forward+backward over `num_tokens` spread over `num_devices`:
    tokens · (6P + 6·layers·d·s̄) / (MFU·F·N), and ×4/3 with full activation recompute."""
    rate_factor = RECOMPUTE_RATE_FACTOR if recompute else 1.0
    flops = num_tokens * _flops_per_token(model, mean_seq_len, 6)
    return flops / (mfu * device.bf16_flops * num_devices * rate_factor)


def logprob_time(model: ModelShape, device: DeviceSpec, num_tokens: int, mean_seq_len: float,
                 num_devices: int, mfu: float = DEFAULT_MFU) -> float:
    """Forward-only log-prob pass: 2 instead of 6 FLOPs per param·token, i.e. 3× the training rate."""
    flops = num_tokens * _flops_per_token(model, mean_seq_len, 6) / LOGPROB_SPEEDUP
    return flops / (mfu * device.bf16_flops * num_devices)


def weight_sync_time(num_bytes: float, bandwidth: float, num_receivers_parallel: int = 1) -> float:
    """Floor for moving `num_bytes` of weights over links of `bandwidth` bytes/s, the
    bytes split evenly over `num_receivers_parallel` links that run at once (e.g. TP
    ranks each receiving their shard). 7B (15.2 GB): 0.04 s over NVLink, 0.3 s over
    one 400G NIC [E, docs/COSTMODEL.md §3]; measured systems are 1×-100× above this floor."""
    return num_bytes / num_receivers_parallel / bandwidth


def kv_transfer_time(model: ModelShape, device: DeviceSpec, num_tokens: int, tp: int = 1,
                     across_nodes: bool = False) -> float:
    """Floor for moving `num_tokens` of a request's KV to another engine: kv_bytes_per_token
    each, the TP ranks' shards side by side, over NVLink within a node (link_bandwidth,
    ~380 GB/s measured) or one NIC across nodes (nic_bandwidth, 50 GB/s) [E, the same
    links as weight sync]. 20k tokens of Qwen2.5-7B (57 kB each, 1.1 GB): 3 ms over
    NVLink, 23 ms across nodes, against 0.6 s to prefill them again on an H100 (prefill_time)."""
    bandwidth = device.nic_bandwidth if across_nodes else device.link_bandwidth
    return num_tokens * model.kv_bytes_per_token / tp / bandwidth


def kv_capacity_tokens(model: ModelShape, device: DeviceSpec, tp: int = 1,
                       mem_util: float = DEFAULT_MEM_UTIL) -> int:
    """KV-cache tokens one engine instance of `tp` devices holds; 0 when the weights do not fit.
    (mem_util·memory·TP − weights − reserve·TP) / kv_bytes_per_token."""
    free = mem_util * device.memory_bytes * tp - model.weight_bytes - KV_RESERVE_BYTES_PER_DEVICE * tp
    return max(0, int(free // model.kv_bytes_per_token))


def role_switch_time(restart: bool = False) -> float:
    """Seconds to hand a device from one role to another (offload + onload), plus an
    engine start when `restart`."""
    return ROLE_SWITCH_S + (ENGINE_RESTART_S if restart else 0.0)
