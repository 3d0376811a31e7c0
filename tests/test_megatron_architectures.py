NUM_GPUS = 0
"""Qwen3 and Llama 3 through megatron-core: the conversion (convert.py) and the GPTModel
options (model.py: qk_layernorm, no qkv bias, llama3 RoPE scaling) against the
native model, on two spawned gloo ranks as one TP=2 group (tests/megatron_cpu.py).

Per architecture, both ranks load the native model's HF weights, compute full
logits, export the weights back to HF names, and take one GRPO step (lr 0) whose
reduced gradients a recording optimizer keeps. Qwen3's q/k norms are replicated
over TP while each rank normalizes only its heads: their gradients are right only
if the TP sum (finalize_model_grads) ran.
"""
import dataclasses
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynarl.components.extras import is_available
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.megatron.convert import hf_to_megatron, slice_for_tp
from dynarl.components.trainer.megatron.model_checks import rope_scaling_problem
from dynarl.components.trainer.native.trainer import NativeTrainer
from test_trainer import MODEL, make_batch, make_config, one_torch_thread, step_gradients  # noqa: F401  (autouse)

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

ARCHITECTURES = {
    # Qwen3: per-head q/k RMSNorm, no qkv bias, head_dim not hidden / heads, tied embeddings
    "qwen3": dataclasses.replace(MODEL, model_type="qwen3", attention_bias=False, qk_norm=True,
                                 explicit_head_dim=48, tie_word_embeddings=True),
    # Llama 3.x: no bias, RoPE frequencies scaled (megatron fixes low/high/original to
    # 1/4/8192); theta 500000 puts head frequencies in all three bands of the scaling
    "llama": dataclasses.replace(MODEL, model_type="llama", attention_bias=False, rope_theta=500000.0,
                                 rope_llama3=(8.0, 1.0, 4.0, 8192)),
}
PROBE_IDS = torch.randint(3, MODEL.vocab_size, (2, 12), generator=torch.Generator().manual_seed(5))
BATCH_SEED = 21
STEP_CONFIG = dict(lr=0.0, grad_clip=0.0)


def _native(name: str) -> Qwen2ForCausalLM:
    torch.manual_seed({"qwen3": 3, "llama": 4}[name])
    model = Qwen2ForCausalLM(ARCHITECTURES[name])
    with torch.no_grad():  # norms start at 1: make them matter
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.uniform_(0.5, 1.5)
    return model


def _ranks(rank: int, world: int, out: str) -> None:
    from megatron.core import parallel_state

    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer
    from megatron_cpu import RecordingOptimizer

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    cfg = MegatronConfig(tensor_parallel_size=2, dtype="float32", use_cpu_initialization=True,
                         use_distributed_optimizer=False)
    for name, config in ARCHITECTURES.items():
        trainer = MegatronTrainer(config, make_config(**STEP_CONFIG), cfg, optimizer_factory=RecordingOptimizer,
                                  hf_weights=load_file(os.path.join(out, f"{name}.hf.safetensors")))
        exported = {n: t.clone() for bucket in trainer.named_weights(bucket_bytes=1 << 20) for n, t in bucket}
        logits = trainer.full_logits(PROBE_IDS)
        metrics = trainer.train_step(make_batch(BATCH_SEED))
        save_file({"logits": logits.contiguous(), **{f"hf.{n}": t for n, t in exported.items()},
                   **{f"grad.{n}": g for n, g in trainer.optimizer.grads.items()}},
                  os.path.join(out, f"{name}.rank{rank}.safetensors"))
        with open(os.path.join(out, f"{name}.rank{rank}.json"), "w") as f:
            json.dump({"metrics": dataclasses.asdict(metrics), "order": list(exported)}, f)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from megatron_cpu import spawn_ranks

    out = tmp_path_factory.mktemp("megatron_arch")
    native = {}
    for name, config in ARCHITECTURES.items():
        model = _native(name)
        hf = {n: p.detach().clone() for n, p in model.named_parameters()}
        save_file(hf, str(out / f"{name}.hf.safetensors"))
        with torch.no_grad():
            logits = model(PROBE_IDS)
        trainer = NativeTrainer(model, make_config(**STEP_CONFIG))
        metrics, grads = step_gradients(trainer, make_batch(BATCH_SEED))
        native[name] = {"hf": hf, "logits": logits, "metrics": dataclasses.asdict(metrics),
                        "grads": dict(hf_to_megatron(grads, config))}
    result = spawn_ranks(_ranks, 2, str(out), error_dir=str(out), timeout_s=600)  # a hang bound
    if result["exitcodes"] != [0, 0]:
        pytest.fail(f"ranks failed: {result['exitcodes']}\n" + "\n".join(result["errors"].values()))
    result.update(out=out, native=native)
    return result


def _rank(run, name, rank):
    return (load_file(str(run["out"] / f"{name}.rank{rank}.safetensors")),
            json.loads((run["out"] / f"{name}.rank{rank}.json").read_text()))


def test_ranks_exit_and_are_reaped(run):
    for pid in run["pids"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_logits_equal_the_native_model(run, name):
    for rank in range(2):
        tensors, _ = _rank(run, name, rank)
        torch.testing.assert_close(tensors["logits"], run["native"][name]["logits"], rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_export_gives_back_the_hf_weights_in_native_order(run, name):
    hf = run["native"][name]["hf"]
    for rank in range(2):
        tensors, info = _rank(run, name, rank)
        assert info["order"] == list(hf)  # what weight_sync's receivers plan their buckets from
        for n, t in hf.items():
            assert torch.equal(tensors[f"hf.{n}"], t), n
    names = set(hf)
    assert any("q_norm" in n for n in names) == (name == "qwen3")
    assert not any(n.endswith("proj.bias") for n in names)
    assert ("lm_head.weight" in names) == (name == "llama")


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_grpo_step_gradients_equal_the_native_trainer(run, name):
    native = run["native"][name]
    for rank in range(2):
        tensors, info = _rank(run, name, rank)
        for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "tokens"):
            assert info["metrics"][key] == pytest.approx(native["metrics"][key], rel=1e-5, abs=1e-7), key
        for n, full in native["grads"].items():
            torch.testing.assert_close(tensors[f"grad.{n}"], slice_for_tp(n, full, rank, 2), rtol=1e-4, atol=1e-6,
                                       msg=n)
    if name == "qwen3":
        assert any("q_layernorm" in n for n in native["grads"])


@pytest.mark.parametrize("rope, problem", [
    (None, False), ((8.0, 1.0, 4.0, 8192), False), ((32.0, 1.0, 4.0, 8192), False),
    ((8.0, 1.0, 4.0, 256), True), ((8.0, 2.0, 4.0, 8192), True)])
def test_rope_scaling_megatron_can_build(rope, problem):
    config = dataclasses.replace(MODEL, model_type="llama", attention_bias=False, rope_llama3=rope)
    assert (rope_scaling_problem(config) is not None) == problem
