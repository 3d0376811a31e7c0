NUM_GPUS = 0
"""The vLLM backend's settings (components/rollout/vllm/config.py), checked without
vllm installed: refusals name what is wrong, and the AsyncEngineArgs keywords carry
what dynarl relies on (token ids in and out, no tokenizer, vLLM's sampling defaults)."""
import pytest

from dynarl import ConfigError
from dynarl.components.rollout.vllm.config import VLLMConfig
from dynarl.components.workflows.config import load_config


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(tp_size=0), "tp_size"), (dict(dtype="int8"), "dtype"), (dict(scheduling_policy="lifo"), "scheduling_policy"),
    (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"), (dict(weight_transport="nccl"), "weight_transport"),
    (dict(cpu_kvcache_space_gib=0), "cpu_kvcache_space_gib"), (dict(engine_args={"seed": 3}), "repeats"),
    (dict(engine_args={"skip_tokenizer_init": False}), "repeats"),
])
def test_bad_settings_are_refused(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        VLLMConfig(**kwargs)


def test_engine_kwargs():
    kwargs = VLLMConfig(model_path="/m", scheduling_policy="priority", engine_args={"block_size": 16}).engine_kwargs()
    assert kwargs["model"] == "/m" and kwargs["scheduling_policy"] == "priority" and kwargs["block_size"] == 16
    assert kwargs["skip_tokenizer_init"] is True and kwargs["generation_config"] == "vllm"
    assert kwargs["distributed_executor_backend"] == "uni" and "weight_transfer_config" not in kwargs
    tp = VLLMConfig(model_path="/m", tp_size=2, weight_transport="cuda_ipc").engine_kwargs()
    assert tp["distributed_executor_backend"] == "mp" and tp["weight_transfer_config"] == {"backend": "ipc"}
    with pytest.raises(ValueError, match="model_path"):
        VLLMConfig().engine_kwargs()


def test_the_section_loads_and_a_bad_field_names_its_path():
    cfg = load_config(None, [("rollout.backend", "vllm"), ("rollout.vllm.dtype", "float32")])
    assert cfg.rollout.vllm.dtype == "float32"
    with pytest.raises(ConfigError) as info:
        load_config(None, [("rollout.backend", "vllm"), ("rollout.vllm.dtype", "int8")])
    assert "rollout.vllm" in str(info.value)
