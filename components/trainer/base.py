"""What every trainer engine (native, megatron, emulated) takes and returns.

Plain data, no torch: the runtime moves these between processes (msgpack), the
emulated twin uses them without tensors, and the P2P reshard planner reads a
`StateLayout` to decide which bytes move from which old rank to which new one.
`to_wire()` / `from_wire()` give msgpack-safe dicts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, get_args

from dynarl.core.config_tree import wire_config

from dynarl.components.trainer.lr_schedule import check_schedule
from dynarl.components.trainer.native.packing import balance_parts


Objective = Literal["grpo", "dr_grpo", "gspo", "dapo", "rloo", "reinforce_pp", "cispo", "opd"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
"""The RL objectives (algorithm.name): trainer/advantages.py, trainer/native/objectives.py."""

RolloutCorrection = Literal["none", "tis", "mis"]
ROLLOUT_CORRECTIONS: tuple[str, ...] = get_args(RolloutCorrection)
"""How the loss weighs tokens by exp(old - rollout log-prob): trainer/native/rollout_correction.py."""

STATE_NAMES = ("master", "exp_avg", "exp_avg_sq", "grad")
"""The sharded per-element state of a ZeRO-1 rank: fp32 master copy of the
parameters, AdamW's two moments, and the reduced gradient of the last step."""


@dataclass(slots=True)
class TrainBatch:
    """A batch of finished rollouts, one entry per sample.

    Sample i is `input_ids[i]` = prompt + response; its response is the tokens from
    `prompt_lens[i]` on. Every per-token list below has one entry per *response*
    token (len(input_ids[i]) - prompt_lens[i] entries), aligned with the rollout's
    output_token_ids / output_logprobs.
    """
    input_ids: list[list[int]]
    prompt_lens: list[int]
    response_mask: list[list[int]] | None = None
    """1 = token is in the loss; 0 = not (padding, tool observations). None = all 1."""
    old_logprobs: list[list[float]] | None = None
    """Log-probs of the policy the step starts from (inference recomputes them: the
    proximal policy). None = on-policy (ratio 1)."""
    behav_logprobs: list[list[float]] | None = None
    """Log-probs the rollout engine sampled with (the behaviour policy), when that is
    older than the step's (algorithm.max_staleness > 0): the loss weighs each token by
    exp(old - behav) (decoupled PPO, losses.py). None = the same policy as old_logprobs."""
    ref_logprobs: list[list[float]] | None = None
    """Log-probs of the reference policy, needed when kl_coef > 0."""
    teacher_logprobs: list[list[float]] | None = None
    """Log-probs of a teacher (objective opd: its advantages, teacher - old, per token)."""
    rewards: list[float] | None = None
    """Per-sample rewards; turned into GRPO advantages within `group_ids`."""
    advantages: list[float] | list[list[float]] | None = None
    """Precomputed advantages, per sample or per response token (PPO/GAE). Wins over rewards."""
    group_ids: list[int] | None = None
    """Samples drawn from the same prompt share a group id (GRPO)."""
    returns: list[list[float]] | None = None
    """A critic's targets per response token (PPO: GAE returns); a batch with returns
    trains a value head (trainer/native/critic.py) and needs no advantages."""
    old_values: list[list[float]] | None = None
    """The critic's values per response token before this step (the value clip's centre)."""

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.prompt_lens) != n:
            raise ValueError(f"prompt_lens has {len(self.prompt_lens)} entries, input_ids has {n}")
        for i, (ids, plen) in enumerate(zip(self.input_ids, self.prompt_lens)):
            if not 1 <= plen <= len(ids):
                raise ValueError(f"prompt_lens[{i}]={plen} must be in [1, len(input_ids[{i}])={len(ids)}]")
        for name in ("response_mask", "old_logprobs", "behav_logprobs", "ref_logprobs", "teacher_logprobs", "returns",
                     "old_values"):
            self._check_per_token(name, getattr(self, name))
        if self.behav_logprobs is not None and self.old_logprobs is None:
            raise ValueError("behav_logprobs needs old_logprobs (the proximal policy's)")
        for name in ("rewards", "group_ids"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries, input_ids has {n}")
        if (self.returns is None) != (self.old_values is None):
            raise ValueError("returns and old_values go together (a critic's batch)")
        if self.advantages is not None:
            if len(self.advantages) != n:
                raise ValueError(f"advantages has {len(self.advantages)} entries, input_ids has {n}")
            if n and isinstance(self.advantages[0], (list, tuple)):
                self._check_per_token("advantages", self.advantages)
        elif self.returns is not None:
            pass  # a critic's batch
        elif self.rewards is None:
            raise ValueError("one of advantages, rewards or returns is required")
        elif self.group_ids is None:
            raise ValueError("group_ids is required to turn rewards into GRPO advantages")

    def _check_per_token(self, name: str, value: Sequence[Sequence[Any]] | None) -> None:
        if value is None:
            return
        if len(value) != len(self.input_ids):
            raise ValueError(f"{name} has {len(value)} entries, input_ids has {len(self.input_ids)}")
        for i, row in enumerate(value):
            expected = len(self.input_ids[i]) - self.prompt_lens[i]
            if len(row) != expected:
                raise ValueError(f"{name}[{i}] has {len(row)} entries, sample {i} has {expected} response tokens")

    def __len__(self) -> int:
        return len(self.input_ids)

    def num_loss_tokens(self) -> int:
        """Response tokens with mask 1: the denominator of the token-mean loss."""
        if self.response_mask is None:
            return sum(len(ids) - p for ids, p in zip(self.input_ids, self.prompt_lens))
        return sum(sum(1 for m in row if m) for row in self.response_mask)

    def select(self, indices: Sequence[int]) -> "TrainBatch":
        """A batch of the samples at `indices`, in that order."""
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            picked[f.name] = None if value is None else [value[i] for i in indices]
        return TrainBatch(**picked)

    def shard(self, rank: int, world_size: int, *, by_tokens: bool = False) -> "TrainBatch":
        """This data-parallel rank's part: contiguous whole groups (so GRPO advantages
        computed on a rank equal those of the full batch), balanced by group count;
        without group ids, contiguous samples balanced by count. `by_tokens`: balanced
        by the samples' token count instead (packing.balance_parts)."""
        return self.select(self.shard_indices(rank, world_size, by_tokens=by_tokens))

    def shard_indices(self, rank: int, world_size: int, *, by_tokens: bool = False) -> list[int]:
        """The samples of `shard(rank, world_size, by_tokens=...)`, in batch order."""
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        if by_tokens:
            return balance_parts([len(ids) for ids in self.input_ids], self.group_ids, world_size)[rank]
        keys = self.group_ids if self.group_ids is not None else list(range(len(self)))
        order = list(dict.fromkeys(keys))  # groups by first appearance
        start, end = shard_ranges(len(order), world_size)[rank]
        mine = set(order[start:end])
        return [i for i, k in enumerate(keys) if k in mine]

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "TrainBatch":
        return cls(**d)


def bucket_by_bytes(named: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Groups (name, tensor) pairs in order into buckets of at most `bucket_bytes`
    (a tensor larger than that gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def check_param_offsets(params: Sequence["ParamSpec"], total_numel: int) -> None:
    """Params lie back to back in the flat space, covering exactly total_numel."""
    offset = 0
    for p in params:
        if p.offset != offset:
            raise ValueError(f"param {p.name} starts at {p.offset}, expected {offset}")
        offset += p.numel
    if offset != total_numel:
        raise ValueError(f"params cover {offset} elements, total_numel is {total_numel}")


def data_parts(world_size: int, tensor_parallel: int = 1) -> list[tuple[int, int]]:
    """(index, count) of the global batch each trainer rank trains on: its data-parallel
    rank and size. Tensor-parallel ranks are innermost (megatron's order with one
    pipeline stage: rank = dp_rank * tp + tp_rank), and share a part."""
    if tensor_parallel < 1 or world_size % tensor_parallel:
        raise ValueError(f"tensor_parallel={tensor_parallel} must be >= 1 and divide world_size={world_size}")
    return [(rank // tensor_parallel, world_size // tensor_parallel) for rank in range(world_size)]


def shard_ranges(total: int, world_size: int) -> list[tuple[int, int]]:
    """ZeRO-1 ownership of a flat space of `total` elements: rank r owns a contiguous
    [start, end) of total // W elements, plus one if r < total % W. Plain Python, so
    the emulated trainer and the reshard planner share it without torch."""
    if total < 0:
        raise ValueError(f"total must be >= 0, got {total}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    base, extra = divmod(total, world_size)
    ranges, start = [], 0
    for rank in range(world_size):
        size = base + (1 if rank < extra else 0)
        ranges.append((start, start + size))
        start += size
    return ranges


@dataclass(slots=True, frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    """Model dtype, e.g. "float32", "bfloat16" (the master copy is always fp32)."""
    offset: int
    """Start of this parameter in the flat space."""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(slots=True)
class StateLayout:
    """ZeRO-1 sharding of a trainer's state over a data-parallel group.

    `params` tile the flat space [0, total_numel) in order. `shards[state][r]` is the
    contiguous [start, end) of that flat space whose `state` (one of STATE_NAMES)
    rank r owns. The optimizer step count is a replicated scalar, not sharded.
    """
    params: tuple[ParamSpec, ...]
    total_numel: int
    world_size: int
    shards: dict[str, tuple[tuple[int, int], ...]]
    master_dtype: str = "float32"

    def __post_init__(self) -> None:
        self.params = tuple(self.params)
        self.shards = {k: tuple((start, end) for start, end in v) for k, v in self.shards.items()}
        check_param_offsets(self.params, self.total_numel)
        for state, ranges in self.shards.items():
            if len(ranges) != self.world_size:
                raise ValueError(f"shards[{state}] has {len(ranges)} ranges for world_size {self.world_size}")
            cursor = 0
            for rank, (start, end) in enumerate(ranges):
                if start != cursor or end < start:
                    raise ValueError(f"shards[{state}][{rank}]=({start}, {end}) does not continue at {cursor}")
                cursor = end
            if cursor != self.total_numel:
                raise ValueError(f"shards[{state}] end at {cursor}, total_numel is {self.total_numel}")

    def owned(self, state: str, rank: int) -> tuple[int, int]:
        return self.shards[state][rank]

    def to_wire(self) -> dict[str, Any]:
        return {"params": [[p.name, list(p.shape), p.dtype, p.offset] for p in self.params],
                "total_numel": self.total_numel, "world_size": self.world_size,
                "shards": {k: [list(r) for r in v] for k, v in self.shards.items()},
                "master_dtype": self.master_dtype}

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "StateLayout":
        params = tuple(ParamSpec(name, tuple(shape), dtype, offset) for name, shape, dtype, offset in d["params"])
        return cls(params=params, total_numel=d["total_numel"], world_size=d["world_size"],
                   shards=d["shards"], master_dtype=d.get("master_dtype", "float32"))


@wire_config(22)
@dataclass(kw_only=True, slots=True)
class TrainerConfig:
    lr: float = 1e-5
    """Peak learning rate; each step's is lr_at(step) (trainer/lr_schedule.py: a function of the step)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After the warmup: constant lr, or a cosine decay to lr * lr_min_ratio over lr_decay_steps."""
    lr_warmup_steps: int = 0
    """Linear warmup: schedule step i < lr_warmup_steps trains at lr * (i + 1) / lr_warmup_steps."""
    lr_decay_steps: int = 0
    """cosine: steps after the warmup from lr to lr * lr_min_ratio (then it stays there); > 0."""
    lr_min_ratio: float = 0.0
    """cosine: the final lr as a fraction of lr, in [0, 1]."""
    lr_step_offset: int = 0
    """Optimizer steps before schedule step 0 (i = step - lr_step_offset): dynarl train sets the policy's
    to trainer.warmup.steps (the warm start trains at its own constant warmup.lr); a critic's stays 0."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward instead of keeping them (less
    activation memory for one more forward; model/qwen2.py set_activation_checkpointing)."""
    cpu_offload: bool = False
    """The native trainer on a GPU keeps its sharded weights, gradients and optimizer state in
    host memory and steps AdamW there (FSDP2's CPUOffloadPolicy), for a trainer sharing its
    devices; on a CPU device they are in host memory anyway."""
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    """AdamW denominator epsilon."""
    weight_decay: float = 0.0
    """Decoupled (AdamW) decay; applied to parameters with 2+ dims only (not biases, norms)."""
    grad_clip: float = 1.0
    """Max global L2 norm of the gradient; 0 disables clipping."""
    micro_batch_size: int = 8
    """Samples per forward/backward; gradients accumulate over a step's micro-batches."""
    max_tokens_per_micro_batch: int | None = None
    """> 0: micro-batches of packed samples, at most this many tokens each (one row, no
    padding, attention kept within each sample; a longer sample alone), instead of
    micro_batch_size padded samples (native engine: micro_batch.micro_batches); set on
    trainer.engine, the GRPO workflow also balances its DP ranks' parts by tokens, not
    by group count. 0: padded. null (the default): padded, or packed (as many tokens as
    the largest padded micro-batch) in a step whose padding would more than 1.5x its
    tokens (native/packing.py packing_budget)."""
    objective: Objective = "grpo"
    """The RL objective its loss and advantages follow (trainer/native/objectives.py): dynarl
    train sets it from algorithm.name (a value given is replaced)."""
    clip_eps_low: float = 0.2
    """PPO ratio clip below: ratio >= 1 - clip_eps_low (gspo: the sequence ratio's; cispo: the
    IS weight's, where 1 means no lower bound). algorithm.clip_eps_low, or the objective's own
    default (gspo, cispo), replaces it."""
    clip_eps_high: float = 0.2
    """PPO ratio clip above: ratio <= 1 + clip_eps_high (DAPO's clip-higher uses 0.28).
    algorithm.clip_eps_high, or the objective's own default (gspo, dapo), replaces it."""
    behav_weight_cap: float = 5.0
    """Decoupled PPO (batches with behav_logprobs): tokens whose behaviour weight
    exp(old - behav) exceeds it are left out of the loss (AReaL's behav_imp_weight_cap;
    5 in its asynchronous examples). Must be > 1. A rollout_correction other than none
    replaces this handling of the weight with its own."""
    rollout_correction: RolloutCorrection = "none"
    """How the loss weighs each token by w = exp(old - rollout log-prob), the rollout
    engine's numerics (and, with staleness, its older weights) against the trainer's
    (trainer/native/rollout_correction.py): none (batches with behav_logprobs: decoupled
    PPO's cap above), tis (min(w, rollout_correction_cap)) or mis (w, and 0 where w >
    rollout_correction_cap). dynarl train sets it from algorithm.rollout_correction (a value
    given is replaced)."""
    rollout_correction_cap: float = 2.0
    """tis and mis: the cap on w; >= 1. Set from algorithm.rollout_correction_cap (a value given
    is replaced, as rollout_correction's)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference policy; > 0 needs ref_logprobs."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (docs/MEASURED.md: 0.05 kept tiny GRPO runs from collapsing)."""
    adv_eps: float = 1e-6
    """GRPO advantage denominator epsilon: (r - mean) / (std + adv_eps)."""
    max_response_len: int = 0
    """dr_grpo's constant length L (its loss is the token sum / (samples x L)) and dapo's L_max:
    dynarl train sets it to rollout.max_new_tokens (a value given is replaced)."""
    overlong_buffer: int = 0
    """dapo: the last this many tokens before max_response_len lower the reward linearly
    (to -overlong_penalty at max_response_len); 0 = off. Set from algorithm.overlong_buffer."""
    overlong_penalty: float = 1.0
    """dapo: the overlong penalty at max_response_len. Set from algorithm.overlong_penalty."""
    seed: int = 0
    """Seeds the trainer's own RNG stream (dropout), offset by the DP rank."""
    value_clip: float = 0.2
    """A critic's (PPO) value clip: each value moves at most this far from its old value
    before the loss takes the worse of the clipped and unclipped errors. Must be > 0."""

    def __post_init__(self) -> None:
        if not self.value_clip > 0:
            raise ValueError(f"value_clip must be > 0, got {self.value_clip}")
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {self.lr}")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas must be two values in [0, 1), got {self.betas}")
        self.betas = (self.betas[0], self.betas[1])  # (a list from a config file)
        for name in ("eps", "adv_eps"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("weight_decay", "grad_clip", "kl_coef", "entropy_coef", "clip_eps_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.behav_weight_cap > 1:
            raise ValueError(f"behav_weight_cap must be > 1, got {self.behav_weight_cap}")
        if self.rollout_correction not in ROLLOUT_CORRECTIONS:
            raise ValueError(f"rollout_correction must be one of {', '.join(ROLLOUT_CORRECTIONS)}, "
                             f"got {self.rollout_correction!r}")
        if not self.rollout_correction_cap >= 1:
            raise ValueError(f"rollout_correction_cap must be >= 1, got {self.rollout_correction_cap}")
        if not 0 <= self.clip_eps_low < 1 and not (self.objective == "cispo" and self.clip_eps_low == 1):
            raise ValueError(f"clip_eps_low must be in [0, 1) (cispo: [0, 1]), got {self.clip_eps_low}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.objective == "dr_grpo" and self.max_response_len < 1:
            raise ValueError("max_response_len must be >= 1 for objective dr_grpo (its loss divides by it)")
        if not 0 <= self.overlong_buffer <= max(self.max_response_len, 0):
            raise ValueError(f"overlong_buffer must be in [0, max_response_len={self.max_response_len}], "
                             f"got {self.overlong_buffer}")
        if self.overlong_penalty < 0:
            raise ValueError(f"overlong_penalty must be >= 0, got {self.overlong_penalty}")
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 0:
            raise ValueError(f"max_tokens_per_micro_batch must be >= 0 (0: padded, null: auto), "
                             f"got {self.max_tokens_per_micro_batch}")
        check_schedule(self)

    def to_wire(self) -> dict[str, Any]:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_wire(cls, d: Mapping[str, Any]) -> "TrainerConfig":
        return cls(**d)
