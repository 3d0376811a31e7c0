"""The one place a worker turns its configured backend into an engine.

The workers stay backend-agnostic: a rollout engine meets rollout/base.py's
RolloutEngine, a trainer trainer/base.py's TrainerEngine. Backends with optional
extras are imported only when selected (backends.py has already checked, at config
load, that the extra is installed).

    rollout    native (NativeRolloutEngine), sglang (SGLangRolloutEngine), vllm (VLLMRolloutEngine),
               emulated (EmulatedRolloutEngine: cost-model time, `dynarl sim`)
    inference  native (NativeInference), emulated (EmulatedInference)
    trainer    native (NativeTrainer), megatron (MegatronTrainer), emulated (EmulatedTrainer)

An emulated engine takes its settings (cost-model model and device, TP, time scale)
from the backend config; the `model` section does not apply to it.

Both trainers start from the same weights: the megatron model is loaded from the
HF tensors ModelSpec names (the folder's, or the native model's seeded init),
converted to megatron's layout, so switching the backend keeps the starting policy.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import torch

from dynarl.components.inference.base import InferenceEngine
from dynarl.components.model.qwen2 import Qwen2ForCausalLM, set_activation_checkpointing
from dynarl.components.model.spec import ModelSpec, build_model, build_policy_model, meta_model
from dynarl.components.rollout.base import RolloutEngine
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.engine import TrainerEngine
from dynarl.components.trainer.threaded import BlockingTrainer


def make_rollout_engine(backend: str, model: ModelSpec, engine: Any, backend_config: Any = None,
                        weight_version: int = -1, device: str = "cpu") -> RolloutEngine:
    """A rollout engine holding weight version `weight_version` (-1: none synced yet):
    native (`engine`, a NativeEngineConfig; its model on `device` in model.dtype), sglang
    (`backend_config`, an SGLangConfig) or emulated (an EmulatedRolloutConfig). sglang:
    call inside the worker's running loop (its TokenizerManager binds to it)."""
    if backend == "native":
        from dynarl.components.rollout.native.engine import NativeRolloutEngine

        dtype = model.engine_dtype(torch.device(device).type)
        return NativeRolloutEngine(build_model(model, device, dtype), engine, weight_version=weight_version)
    if backend == "sglang":
        from dynarl.components.rollout.sglang.config import for_device
        from dynarl.components.rollout.sglang.engine import SGLangRolloutEngine

        kind = torch.device(device).type
        config, owned = served_by(model, backend_config or _default("sglang"))
        config = for_device(config, kind, str(model.engine_dtype(kind)).removeprefix("torch."))
        return SGLangRolloutEngine.start(config, weight_version, owned_dir=owned)
    if backend == "vllm":
        from dynarl.components.rollout.vllm.engine import VLLMRolloutEngine

        config, owned = served_by(model, backend_config or _default("vllm"))
        return VLLMRolloutEngine.start(config, weight_version, owned_dir=owned)
    if backend == "emulated":
        from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
        from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine

        return EmulatedRolloutEngine(backend_config or EmulatedRolloutConfig(), weight_version=weight_version)
    raise ValueError(f"rollout backend {backend!r} has no engine here; choose 'native', 'sglang', 'vllm' or 'emulated'")


def make_inference_engine(backend: str, model: ModelSpec, micro_batch_size: int, emulated: Any = None,
                          device: str = "cpu") -> InferenceEngine:
    """An inference engine (inference/base.py) holding no policy weights yet (version -1),
    on `device` in model.dtype; `emulated`: an EmulatedInferenceConfig."""
    if backend == "native":
        from dynarl.components.inference.native import NativeInference

        return NativeInference(build_model(model, device, model.engine_dtype(torch.device(device).type)),
                               micro_batch_size, device)
    if backend == "emulated":
        from dynarl.components.inference.emulated import EmulatedInference, EmulatedInferenceConfig

        return EmulatedInference(emulated or EmulatedInferenceConfig(), weight_version=-1)
    raise ValueError(f"inference backend {backend!r} has no engine here; choose 'native' or 'emulated'")


def _default(backend: str) -> Any:
    if backend == "sglang":
        from dynarl.components.rollout.sglang.config import SGLangConfig
        return SGLangConfig()
    from dynarl.components.rollout.vllm.config import VLLMConfig
    return VLLMConfig()


def served_by(model: ModelSpec, config: Any) -> tuple[Any, str | None]:
    """An external engine's config (SGLangConfig, VLLMConfig: both have model_path) with
    the HF folder it loads: its own model_path, else the job's model.path, else the
    built-in model's seeded weights written to a temporary folder, returned second (the
    engine removes it at shutdown). The engine reads the architecture there; the
    trainer's weights replace the folder's at the first sync."""
    if config.model_path or model.path:
        return (config if config.model_path else dataclasses.replace(config, model_path=model.path)), None
    import tempfile

    from dynarl.components.model.io import save_pretrained
    folder = tempfile.mkdtemp(prefix="dynarl-engine-model-")
    save_pretrained(build_model(model), folder)
    return dataclasses.replace(config, model_path=folder), folder


async def make_trainer(backend: str, model: ModelSpec, config: TrainerConfig, backend_config: Any = None,
                       group: Any = None, *, rank: int = 0, world_size: int = 1, head: str = "policy",
                       device: str = "cpu") -> TrainerEngine:
    """One trainer rank, behind the async TrainerEngine contract, its float32 weights on
    `device` (megatron places its own). Collective over
    `group` (the trainer's data-parallel runtime group, None for a single rank).
    `backend_config`: a MegatronConfig or an EmulatedTrainerConfig. `head` "value": a
    critic (trainer/native/critic.py) on `model`'s decoder, native or emulated."""
    if head not in ("policy", "value"):
        raise ValueError(f"head must be 'policy' or 'value', got {head!r}")
    if head == "value" and backend == "megatron":
        raise ValueError("a critic runs on the native or the emulated trainer, not megatron")
    if head == "value" and backend == "native":
        from dynarl.components.trainer.native.critic import NativeCritic, value_head
        from dynarl.components.trainer.threaded import ThreadedTrainer

        return ThreadedTrainer(await asyncio.to_thread(
            lambda: NativeCritic(value_head(trainer_model(model, device, config)), config, group)))
    if backend == "emulated":  # (a critic's is the same: the cost model times a value head as an LM head)
        from dynarl.components.trainer.emulated.engine import EmulatedTrainer, EmulatedTrainerConfig

        size = group.size() if group is not None else 1
        return EmulatedTrainer(config, emulation=backend_config or EmulatedTrainerConfig(),
                               rank=group.rank() if group is not None else 0, world_size=size)
    from dynarl.components.trainer.threaded import ThreadedTrainer

    return ThreadedTrainer(await asyncio.to_thread(_blocking_trainer, backend, model, config, backend_config,
                                                   group, device))


def _blocking_trainer(backend: str, spec: ModelSpec, config: TrainerConfig, megatron: Any, group: Any,
                      device: str) -> BlockingTrainer:
    if backend == "native":
        from dynarl.components.trainer.native.trainer import NativeTrainer

        return NativeTrainer(trainer_model(spec, device, config), config, group)
    if backend == "megatron":
        from dynarl.components.model.io import read_state_dict
        from dynarl.components.trainer.megatron.config import MegatronConfig
        from dynarl.components.trainer.megatron.trainer import MegatronTrainer

        # the starting weights with HF names: the folder's tensors as stored (no float32
        # model built on the side), or the seeded init of a built-in config
        start = read_state_dict(spec.path) if spec.path else dict(build_model(spec).state_dict())
        from dynarl.components.trainer.world import init_default_group

        init_default_group(group, replace=False)
        return MegatronTrainer(spec.config(), config, megatron or MegatronConfig(), hf_weights=start)
    raise ValueError(f"trainer backend {backend!r} has no engine here; choose 'native', 'megatron' or 'emulated'")


def trainer_model(spec: ModelSpec, device: str, config: TrainerConfig) -> Qwen2ForCausalLM:
    """A native trainer's model on `device`: LoRA-adapted when model.lora asks for it,
    with the config's activation checkpointing."""
    model = build_policy_model(spec, device)
    set_activation_checkpointing(model, config.activation_checkpointing)
    return model


def hf_model(trainer: Any, model: ModelSpec, bucket_bytes: int) -> Qwen2ForCausalLM:
    """The trainer's current weights as a native (HF-layout) model, for save_pretrained.
    Collective: over the native trainer's DP group (FSDP gathers each weight), over
    megatron's TP group. A LoRA policy's weights come merged (NativeTrainer.named_weights)."""
    from dynarl.components.model.io import load_weights
    engine = trainer.engine  # a ThreadedTrainer's blocking engine (this runs in a thread)
    native = build_model(model)
    load_weights(native, [pair for bucket in engine.named_weights(bucket_bytes) for pair in bucket], strict=True)
    return native


def weights_template(engine: Any, model: ModelSpec, device_kind: str = "cpu") -> torch.nn.Module | None:
    """The module weight_sync.receive plans its buckets from (names, shapes and dtype, in
    the native model's order): the native engine's own model, or for an engine that holds
    no torch model (sglang) the native architecture on the meta device (no memory) in
    model.dtype;
    None for an emulated engine (its weights are a byte count)."""
    from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine

    if isinstance(engine, EmulatedRolloutEngine):
        return None
    own = getattr(engine, "model", None)
    if isinstance(own, torch.nn.Module):
        return own
    return meta_model(model, model.engine_dtype(device_kind))
