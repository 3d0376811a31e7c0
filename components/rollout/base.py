"""What every rollout engine (native, emulated, sglang) takes and returns.

Plain data, no torch: the runtime moves these between processes (msgpack) and the
scheduler reads them. `to_wire()` / `from_wire()` give msgpack-safe dicts.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Protocol, Sequence


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    """Per-request seed. The token at output position i is drawn from a generator
    seeded by (seed, i), so a request continued on another engine (Workload
    migration) draws the same tokens as an uninterrupted run."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        self.stop_token_ids = tuple(self.stop_token_ids)


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tool_count: int = 0
    """Tool calls made so far by the episode this turn belongs to (priority key)."""
    arrival_time: float = 0.0
    """Loop time when the request reached the engine (for FIFO and age bounds)."""

    def to_wire(self) -> dict[str, Any]:
        d = asdict(self)
        d["sampling"]["stop_token_ids"] = list(self.sampling.stop_token_ids)
        return d

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "GenerationRequest":
        d = dict(d)
        d["sampling"] = SamplingParams(**d["sampling"])
        return cls(**d)


@dataclass(slots=True)
class GenerationResult:
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str
    """'stop' (a stop token), 'length' (max_new_tokens), or 'abort'."""
    weight_version: int
    """Weight version that generated the last token."""
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache when the request was (last) admitted."""

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "GenerationResult":
        return cls(**d)


@dataclass(slots=True)
class InflightRequest:
    """A request taken out of an engine mid-generation (Workload migration)."""
    request: GenerationRequest
    output_token_ids: list[int]
    output_logprobs: list[float]

    def to_wire(self) -> dict[str, Any]:
        return {"request": self.request.to_wire(),
                "output_token_ids": list(self.output_token_ids),
                "output_logprobs": list(self.output_logprobs)}

    @classmethod
    def from_wire(cls, d: dict[str, Any]) -> "InflightRequest":
        return cls(GenerationRequest.from_wire(d["request"]),
                   list(d["output_token_ids"]), list(d["output_logprobs"]))


@dataclass(slots=True)
class KVBlocks:
    """A request's computed KV, for another engine's prefix cache (a prefix-preserving
    Workload migration): the full blocks of `token_ids` (a whole number of blocks), K
    and V as [layers, blocks, block_size, kv_heads, head_dim], and the weight version
    they were computed with (an engine holding other weights refuses them)."""
    token_ids: list[int]
    k: Any
    v: Any
    weight_version: int
    request_id: str = ""
    """The exported request it was computed for."""

    def to_wire(self) -> list[Any]:
        return [list(self.token_ids), self.k, self.v, self.weight_version, self.request_id]

    @classmethod
    def from_wire(cls, w: list[Any]) -> "KVBlocks":
        token_ids, k, v, version, request_id = w
        return cls(list(token_ids), k, v, int(version), str(request_id))


@dataclass(slots=True)
class EngineLoad:
    active_kv_tokens: int
    kv_capacity_tokens: int
    num_running: int
    num_waiting: int
    cache_hit_tokens: int
    """Prompt tokens served from the prefix cache since the engine started."""
    generated_tokens: int = 0
    """Output tokens the held (running and waiting) requests have made so far."""
    budget_tokens: int = 0
    """Output tokens the held requests may still make at most (max_new_tokens left)."""
    num_preemptions: int = 0
    """Requests preempted for KV since the engine started (0 where the engine does not say)."""
    reprefill_tokens: int = 0
    """Tokens of requests imported from other engines computed again here since it
    started (0 where the engine does not say)."""
    devices: int = 1
    """Devices the engine spans (its tensor-parallel size): its busy time counts that many times."""
    prefill_s_per_token: float = 0.0
    """Seconds its prefill takes per new token (measured, or the cost model's); 0: not known."""
    kv_move_s_per_token: float = 0.0
    """Seconds a token of KV moved to it takes to arrive (across nodes, the worse case); 0: not known."""
    kv_import_s: float = 0.0
    """Seconds its import_kv calls took since it started (measured, or the transfer an
    emulated engine charged itself); with the fetch before it, a KV move's cost."""

    @property
    def utilization(self) -> float:
        """The DynaRL utilization signal: active KV tokens / capacity."""
        return self.active_kv_tokens / self.kv_capacity_tokens if self.kv_capacity_tokens else 0.0


QueueKey = Callable[[GenerationRequest, int], Any]
"""Orders an engine's waiting queue: smaller keys go first. Called with the request
and the number of its prompt tokens already in the prefix cache. The default is
FIFO: (arrival_time, admission sequence)."""


class RolloutEngine(Protocol):
    """The contract every rollout backend (native, emulated, sglang) meets; workers,
    the scheduler and the migrations use nothing else. `step()` runs one scheduler
    iteration (a prefill or a decode batch) and returns requests that finished.

    Queueing calls are synchronous (they only enqueue); every call that talks to the
    engine's scheduler is a coroutine (SGLang's run in other processes), awaited by
    its caller: load, abort, pause, resume, export_inflight, update_weights,
    release_memory, resume_memory.

    Semantics the migrations rely on: after `pause()` no new step runs until
    `resume()` (a step in flight completes), and requests keep their KV;
    `export_inflight()` takes every unfinished request out with its tokens so far, and
    `import_inflight()` on any engine continues them at the right output positions
    (seeded sampling: the same tokens as an uninterrupted run); `release_memory()` is
    refused while requests are running.

    KV moves with a request where the engine can (`export_kv` after the export,
    `import_kv` before the import: the importer's prefix cache then serves the moved
    prefix, and only the tail is computed again); an engine that cannot returns None /
    0 and the request is re-prefilled. Either way `EngineLoad.reprefill_tokens` counts
    what an imported request computed again."""

    weight_version: int
    steps_on_loop: bool
    """`step()` computes on the worker's event loop (the native engine's model runs in
    it), so nothing else of the rank runs meanwhile: a round trip to the controller waits
    for the step. A worker then takes its share of a step's prompts in one trip
    (RolloutWorker.generate); an engine that steps elsewhere (SGLang, vLLM, the
    emulated one in virtual time) takes them a group a trip, whichever rank asks first."""

    def add_request(self, request: GenerationRequest) -> None: ...
    def import_inflight(self, items: Sequence[InflightRequest]) -> None: ...
    def has_work(self) -> bool: ...
    def running_request_ids(self) -> list[str]: ...
    def set_queue_key(self, key: QueueKey | None) -> None: ...
    async def step(self) -> list[GenerationResult]: ...
    async def generate(self, requests: Sequence[GenerationRequest]) -> list[GenerationResult]: ...
    async def load(self) -> EngineLoad: ...
    async def abort(self, request_ids: Sequence[str]) -> list[GenerationResult]: ...
    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def export_inflight(self) -> list[InflightRequest]: ...
    async def export_kv(self, item: InflightRequest) -> KVBlocks | None:
        """The KV this engine still holds for the longest cached prefix of an exported
        request's tokens (its prompt and output so far)."""
    def import_kv(self, kv: KVBlocks, across_nodes: bool = False) -> int:
        """Into the prefix cache; returns the tokens installed (0: refused, no room, or
        already cached). `across_nodes`: the KV came from another node (over the NIC,
        not the node's device links; an engine that models transfer time prices it)."""
    async def update_weights(self, named_tensors: Any, version: int) -> None: ...
    async def release_memory(self) -> None: ...
    async def resume_memory(self) -> None: ...
