"""The memory plan (components/memory): formulas as table tests against bytes worked
out by hand from their sources, the plan of a config, and the launcher's refusal
(rc 2 before any worker starts) of a plan over a device's memory."""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from dynarl.components.costmodel import get_model
from dynarl.components.memory import engines as e
from dynarl.components.memory import formulas as f
from dynarl.components.memory.of_config import plan_of
from dynarl.components.memory.table import refusal
from dynarl.components.model.config import ModelConfig
from dynarl.components.workflows.config import load_config
from dynarl.launch.train import main

QWEN_7B = ModelConfig(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                      num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32_768)
QWEN_32B = dict(vocab_size=152_064, hidden_size=5120, intermediate_size=27_648, num_hidden_layers=64,
                num_attention_heads=40, num_key_value_heads=8, max_position_embeddings=32_768,
                model_type="qwen2", architectures=["Qwen2ForCausalLM"], tie_word_embeddings=False,
                rms_norm_eps=1e-6, rope_theta=1_000_000.0)
GPT = ModelConfig(vocab_size=1000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=1,
                  num_attention_heads=16, num_key_value_heads=16, attention_bias=False)
"""GPT's proportions (q = kv = h, MLP 4h) for Korthikanti et al.'s per-layer count."""
P7 = QWEN_7B.num_parameters  # 7_615_616_512: Qwen2.5-7B's card says 7.61B


@pytest.mark.parametrize("what, got, expected", [
    ("7B bf16 weights", f.weight_bytes(QWEN_7B, 2), 2 * 7_615_616_512),
    ("7B bf16 weights, TP 2", f.weight_bytes(QWEN_7B, 2, 2), 7_615_616_512),
    # 2 (K, V) x 28 layers x 4 KV heads x 128 x 2 bytes; the cost model's own figure
    ("7B KV per token", f.kv_bytes_per_token(QWEN_7B, 2), 57_344),
    ("7B KV per token, cost model", f.kv_bytes_per_token(QWEN_7B, 2), get_model("qwen2.5-7b").kv_bytes_per_token),
    ("7B KV per token, TP 2", f.kv_bytes_per_token(QWEN_7B, 2, 2), 28_672),
    ("7B KV per token, TP 8 (heads replicated)", f.kv_bytes_per_token(QWEN_7B, 2, 8), 14_336),
    # Korthikanti et al. 2022 eq. 2 without dropout masks and scores, s.b.h.(8 + 8/t + 16/t),
    # with the gated MLP's four I-wide tensors for GPT's two 4h-wide ones: s.b.h.(8 + (8 + 32)/t)
    ("GPT-shaped layer, t 1", f.layer_activation_bytes(GPT, 2048, 2), 2048 * 1024 * 48),
    ("GPT-shaped layer, t 2", f.layer_activation_bytes(GPT, 2048, 2, 2), 2048 * 1024 * 28),
    ("GPT-shaped layer, t 8", f.layer_activation_bytes(GPT, 2048, 2, 8), 2048 * 1024 * 13),
    ("logits fp32 + log-softmax, t 2", f.logits_bytes(QWEN_7B, 1000, 8, 2), 1000 * 152_064 * 4),
])
def test_formulas(what, got, expected):
    assert got == expected, what


def _cfg(**sections):
    base = {"trainer": {"engine": {"micro_batch_size": 2}}, "rollout": {"max_new_tokens": 1024}}
    for k, v in sections.items():
        base[k] = {**base.get(k, {}), **v}
    return load_config(base)


GPU = e.Shape("cuda", 80 * 10**9, 2048)
CPU = e.Shape("cpu", 16 * 10**9, 2048)


def _megatron(tp, world, distributed=True, dtype="bfloat16"):
    cfg = SimpleNamespace(trainer=SimpleNamespace(
        megatron=SimpleNamespace(tensor_parallel_size=tp, dtype=dtype, use_distributed_optimizer=distributed,
                                 grad_reduce_in_fp32=True),
        engine=SimpleNamespace(micro_batch_size=1)))
    return e.megatron_trainer(cfg, QWEN_7B, GPU, world)[0]


@pytest.mark.parametrize("tp, world, distributed, dtype, weights, grads, optimizer", [
    # megatron's distributed-optimizer guide: bf16 + fp32 grads = 6 + 12/d bytes per parameter
    (1, 1, True, "bfloat16", 2 * P7, 4 * P7, 12 * P7),
    (2, 4, True, "bfloat16", P7, 2 * P7, 3 * P7),       # 12 P / (t 2 x d 2)
    (2, 4, False, "bfloat16", P7, 2 * P7, 6 * P7),      # not distributed: 12 P / t
    (1, 2, True, "float32", 4 * P7, 4 * P7, 4 * P7),    # fp32: no main copy, 8 P / d
])
def test_megatron_bytes(tp, world, distributed, dtype, weights, grads, optimizer):
    held = _megatron(tp, world, distributed, dtype)
    assert (held["weights"], held["gradients"], held["optimizer state"]) == (weights, grads, optimizer)


@pytest.mark.parametrize("shape, world, weights, state", [
    (CPU, 1, 4 * P7, 16 * P7),   # fp32 weights; ZeRO-1 shard: master, two moments, gradient
    (CPU, 4, 4 * P7, 4 * P7),
    (GPU, 2, 2 * P7, 8 * P7),    # bf16 weights on a GPU; the shard stays fp32
])
def test_native_trainer_bytes(shape, world, weights, state):
    cfg = SimpleNamespace(trainer=SimpleNamespace(engine=SimpleNamespace(micro_batch_size=1, entropy_coef=0)),
                          rollout=SimpleNamespace(max_new_tokens=16))
    held, working = e.native_trainer(cfg, QWEN_7B, shape, world)
    assert held == {"weights": weights, "optimizer state": state}
    assert sum(working.values()) >= (4 + shape.native_dtype_bytes) * P7  # the flat gradient beside the grads


@pytest.mark.parametrize("backend, settings, pool", [
    ("sglang", {"mem_fraction_static": 0.85, "tp_size": 1}, 0.85),
    ("sglang", None, e.DEFAULT_SGLANG_FRACTION),
    ("vllm", {"gpu_memory_utilization": 0.6, "tp_size": 1}, 0.6),
    ("vllm", {"gpu_memory_utilization": None, "tp_size": 1}, e.DEFAULT_VLLM_UTILIZATION),
])
def test_static_pool_engines(backend, settings, pool):
    """SGLang's mem_fraction_static and vLLM's gpu_memory_utilization: the engine's
    weights + KV take that fraction of the device while it generates; released, the weights stay."""
    from dynarl.components.memory.plan import _static_pool
    rollout = SimpleNamespace(backend=backend, sglang=None, vllm=None)
    if settings is not None:
        setattr(rollout, backend, SimpleNamespace(**settings, weight_bucket_bytes=1 << 20))
    cfg = SimpleNamespace(rollout=rollout, trainer=SimpleNamespace(sync_bucket_bytes=1 << 20))
    tp, fraction, _ = _static_pool(cfg, backend)
    held, working = e.static_pool_rollout(cfg, QWEN_7B, GPU, fraction, tp, backend)
    assert held == {"weights": 2 * P7}
    assert sum(held.values()) + sum(working.values()) == int(pool * GPU.device_bytes)


def test_example_8xh100_fits_every_gpu(capsys):
    """The 8xH100 example's dry run prints the per-GPU table: all eight under 80 GB."""
    assert main(["examples/grpo_qwen2.5_7b_8xh100.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith("gpu") and not line.endswith(":")]
    assert [r[0] for r in rows] == [f"gpu{i}" for i in range(8)]
    for _, peak, margin, _phase in rows:
        assert 0 < float(peak) < 80 and float(margin) == pytest.approx(80 - float(peak), abs=0.11)
    cfg = load_config(_yaml("examples/grpo_qwen2.5_7b_8xh100.yaml"))
    plan = plan_of(cfg)
    assert {d.peak_phase for d in plan.devices} >= {"train", "move"}
    assert refusal(plan) is None


def _yaml(path):
    import yaml
    with open(path) as fh:
        return yaml.safe_load(fh)


@pytest.fixture
def qwen32b(tmp_path):
    folder = tmp_path / "qwen2.5-32b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_32B))
    return str(folder)


ONE_GPU = ["runtime.cluster.device_kind=cuda", "runtime.cluster.devices_per_node=1", "rollout.num_ranks=1",
           "inference.num_ranks=1", "trainer.num_ranks=1", "run.prompts_per_step=1"]


def test_32b_on_one_gpu_is_refused(qwen32b, capsys):
    """A 32B model's native trainer on one 80 GB GPU: refused before start, rc 2, naming
    the device, the component and the numbers."""
    rc = main(["--dry-run", f"model.path={qwen32b}", *ONE_GPU])
    err = capsys.readouterr().err
    assert rc == 2
    assert "memory: device 0 (cuda) needs" in err and "but has 80.0 GB" in err and "trainer.0 holds" in err
    assert "Traceback" not in err


def test_32b_refused_by_the_launch_too(qwen32b, capsys):
    """Without --dry-run the same check runs in prepare(), before any worker."""
    from dynarl.launch.train import check_memory, parse_override
    one_gpu = [parse_override(o) for o in ONE_GPU]
    cfg = load_config(None, [("model.path", qwen32b), *one_gpu])
    with pytest.raises(Exception, match="memory: device 0"):
        check_memory(cfg)
    off = load_config(None, [("model.path", qwen32b), ("memory.check", False), *one_gpu])
    check_memory(off)  # memory.check false: printed, not refused


def test_device_memory_is_validated_at_load(capsys):
    assert main(["--dry-run", "runtime.cluster.device_memory_gb=0"]) == 2
    assert "runtime.cluster.device_memory_gb" in capsys.readouterr().err


def test_tiny_cpu_device_refused(capsys):
    """CPU logical devices take the configured size too."""
    assert main(["--dry-run", "runtime.cluster.device_memory_gb=0.001"]) == 2
    assert "memory: device 0 (cpu)" in capsys.readouterr().err
    assert main(["--dry-run", "runtime.cluster.device_memory_gb=4"]) == 0
    assert "memory plan: 4.0 GB per cpu device" in capsys.readouterr().out


def test_cpu_default_shares_the_host():
    from dynarl.components.memory.of_config import device_bytes, host_memory_bytes
    cfg = load_config(None)
    assert device_bytes(cfg.runtime.cluster) == host_memory_bytes() // cfg.runtime.cluster.devices_per_node
    assert os.sysconf("SC_PHYS_PAGES") > 0


def test_plan_is_pure_and_sums_by_phase():
    """Same inputs, same table; each phase's total is its parts' sum; a temporal job's
    trainer phase holds the trainer's working parts, the others only what they keep."""
    cfg = _cfg()
    a, b = plan_of(cfg), plan_of(cfg)
    assert a == b
    dev = a.devices[0]
    train = dev.phases["train"]
    assert dev.total("train") == sum(sum(p.values()) for p in train.values())
    assert "activations" in train["trainer.0"] or "optimizer step" in train["trainer.0"]
    assert "kv cache" not in train["rollout.0"] and "kv cache" in dev.phases["rollout"]["rollout.0"]


def test_vllm_backend_is_planned(capsys):
    """rollout.backend vllm: its gpu_memory_utilization of each GPU while it generates."""
    assert main(["examples/grpo_qwen2.5_7b_8xh100.yaml", "--dry-run", "rollout.backend=vllm", "rollout.sglang=null",
                 "rollout.vllm.gpu_memory_utilization=0.7", "scheduler.policy=static"]) == 0
    out = capsys.readouterr().out
    assert "rollout     56.5  rollout.0 [weights 15.2, cuda context 0.5, vllm (kv cache) 40.8]" in out


def test_megatron_without_its_section_is_planned_with_the_backends_defaults():
    """trainer.backend=megatron alone (no trainer.megatron section): the plan takes
    MegatronConfig's defaults, as the engine factory does, instead of failing."""
    cfg = load_config(None, [("trainer.backend", "megatron")])
    plan = plan_of(cfg)
    trainer = plan.devices[0].phases["train"]["trainer.0"]
    assert trainer["weights"] > 0 and trainer["optimizer state"] > 0


@pytest.mark.parametrize("devices, extra_gb, fits", [
    ([2], 1.0, True),        # a rollout GPU at 68.5 GB
    ([2, 3], 11.0, True),
    ([2], 12.0, False),      # 68.5 + 12 > 80
    ([0], 2.0, False),       # a GPU the trainer grows onto peaks at 78.3
    ([2, 0], 1.0, True),
    ([2, 0], 2.0, False),    # every device must have the room
])
def test_a_throwaway_trainer_fits_beside_the_job_only_with_room(devices, extra_gb, fits):
    from dynarl.components.memory.plan import fits_beside
    plan = plan_of(load_config(_yaml("examples/grpo_qwen2.5_7b_8xh100.yaml"), []))
    assert fits_beside(plan, devices, int(extra_gb * 1e9)) is fits


def test_the_7b_jobs_trainer_profile_fits_nowhere():
    """scheduler.dynarl's start-up profile builds a throwaway trainer: at 7B no GPU of
    the example has room for one (it learns the trainer's rate from its first step)."""
    from dynarl.components.memory.plan import fits_beside, trainer_rank_bytes
    cfg = load_config(_yaml("examples/grpo_qwen2.5_7b_8xh100.yaml"), [])
    plan = plan_of(cfg)
    for world in (4, 5, 6, 7):
        devices = list(range(4, 8)) + list(range(world - 4))
        assert not fits_beside(plan, devices, trainer_rank_bytes(cfg, cfg.model.config(), plan, world))
