"""Stand-ins for the sglang 0.5.23 request structs the rollout adapter builds
(`sglang.srt.managers.io_struct`), and the real call signatures the fake engine must
keep (read from the 0.5.23 wheel: entrypoints/engine.py, managers/tokenizer_manager.py,
managers/tokenizer_control_mixin.py, managers/io_struct.py, managers/load_snapshot.py).

The real structs are msgspec Structs with kw_only=True: positional or unknown
arguments raise TypeError, as these dataclasses do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

PAUSE_MODES = ("abort", "retract", "in_place")


@dataclass(kw_only=True)
class PauseGenerationReqInput:
    mode: str = "abort"

    def __post_init__(self) -> None:
        if self.mode not in PAUSE_MODES:  # a Literal in sglang; stricter here
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {self.mode!r}")


@dataclass(kw_only=True)
class ContinueGenerationReqInput:
    torch_empty_cache: bool = True


@dataclass(kw_only=True)
class BeginWeightUpdateReqInput:
    selector: str = "all"


@dataclass(kw_only=True)
class EndWeightUpdateReqInput:
    pass


@dataclass(kw_only=True)
class UpdateWeightsFromTensorReqInput:
    serialized_named_tensors: list
    load_format: Optional[str] = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: Optional[str] = None
    selector: str = "all"
    torch_empty_cache: bool = False


@dataclass(kw_only=True)
class ReleaseMemoryOccupationReqInput:
    tags: Optional[list] = None


@dataclass(kw_only=True)
class ResumeMemoryOccupationReqInput:
    tags: Optional[list] = None


@dataclass(kw_only=True)
class FlushCacheReqOutput:
    success: bool
    message: str = ""


@dataclass
class LoadSnapshot:
    """The core fields of sglang's LoadSnapshot (managers/load_snapshot.py)."""
    dp_rank: int = 0
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    num_used_tokens: int = 0
    num_total_tokens: int = 0
    max_total_num_tokens: int = 0
    token_usage: float = 0.0
    cache_hit_rate: float = 0.0


SAMPLING_FIELDS = frozenset({
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k", "min_p",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n", "beam_width",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias", "sampling_seed",
    "custom_params", "watermark"})
"""The API fields of sglang's SamplingParams (sampling/sampling_params.py)."""

GENERATE_PARAMS = (
    "prompt", "sampling_params", "input_ids", "image_data", "audio_data", "video_data", "mm_hashes",
    "mm_content_hashes", "return_logprob", "logprob_start_len", "top_logprobs_num", "token_ids_logprob",
    "lora_path", "custom_logit_processor", "require_reasoning", "return_hidden_states", "return_routed_experts",
    "routed_experts_start_len", "stream", "bootstrap_host", "bootstrap_port", "bootstrap_room", "routed_dp_rank",
    "disagg_prefill_dp_rank", "kv_hints", "data_parallel_rank", "external_trace_header", "rid", "session_params",
    "priority", "session_id", "cache_salt")

REAL_SIGNATURES = {
    "FakeEngine.async_generate": GENERATE_PARAMS,
    "FakeTokenizerManager.abort_request": ("rid", "abort_all"),
    "FakeTokenizerManager.pause_generation": ("obj",),
    "FakeTokenizerManager.continue_generation": ("obj",),
    "FakeTokenizerManager.get_loads": ("include", "dp_rank"),
    "FakeTokenizerManager.flush_cache": ("timeout_s",),
    "FakeTokenizerManager.begin_weight_update": ("obj", "request"),
    "FakeTokenizerManager.end_weight_update": ("obj", "request"),
    "FakeTokenizerManager.update_weights_from_tensor": ("obj", "request"),
    "FakeTokenizerManager.release_memory_occupation": ("obj", "request"),
    "FakeTokenizerManager.resume_memory_occupation": ("obj", "request"),
}
"""Parameter names (self left out) of the sglang 0.5.23 methods (Engine.async_generate,
TokenizerManager.*) that the fake's methods mirror."""
