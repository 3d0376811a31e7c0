NUM_GPUS = 0
"""algorithm.rollout_correction on the megatron trainer: its loss is the native one
(losses.micro_batch_loss on the same micro-batches), so a step on a batch with the
rollout's log-probs weighs its tokens as the native trainer does. One spawned gloo rank
on CPU (tests/megatron_cpu.py), TP 1, a recording optimizer; the native trainer here."""
import dataclasses
import json
import os
import random

import pytest
import torch
from safetensors.torch import load_file, save_file

from dynarl.components.extras import is_available
from dynarl.components.model.io import load_weights
from dynarl.components.model.qwen2 import Qwen2ForCausalLM
from dynarl.components.trainer.megatron.convert import hf_to_megatron
from dynarl.components.trainer.native.trainer import NativeTrainer
from test_trainer import MODEL, make_batch, make_config, one_torch_thread, step_gradients  # noqa: F401  (autouse)

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

CONFIG = dict(lr=0.0, grad_clip=0.0, rollout_correction="tis", rollout_correction_cap=1.3)


def corrected_batch():
    """make_batch's, with rollout log-probs off the old ones by up to 0.6 nats: weights
    from 0.55 to 1.8, some above the cap."""
    batch = make_batch(31)
    rng = random.Random(4)
    rollout = [[x + rng.uniform(-0.6, 0.6) for x in row] for row in batch.old_logprobs]
    return dataclasses.replace(batch, behav_logprobs=rollout)


def _rank(rank: int, world: int, out: str) -> None:
    from megatron.core import parallel_state

    from dynarl.components.trainer.megatron.config import MegatronConfig
    from dynarl.components.trainer.megatron.trainer import MegatronTrainer
    from megatron_cpu import RecordingOptimizer

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
    cfg = MegatronConfig(tensor_parallel_size=1, dtype="float32", use_cpu_initialization=True, seed=5,
                         use_distributed_optimizer=False)
    trainer = MegatronTrainer(MODEL, make_config(**CONFIG), cfg, optimizer_factory=RecordingOptimizer)
    hf = {name: t.clone() for bucket in trainer.named_weights(bucket_bytes=1 << 30) for name, t in bucket}
    metrics = trainer.train_step(corrected_batch())
    save_file(hf, os.path.join(out, "hf.safetensors"))
    save_file({f"grad.{n}": g for n, g in trainer.optimizer.grads.items()}, os.path.join(out, "grads.safetensors"))
    with open(os.path.join(out, "metrics.json"), "w") as f:
        json.dump(dataclasses.asdict(metrics), f)


def test_a_megatron_step_weighs_tokens_as_the_native_one(tmp_path):
    from megatron_cpu import spawn_ranks

    result = spawn_ranks(_rank, 1, str(tmp_path), error_dir=str(tmp_path), timeout_s=600)
    assert result["exitcodes"] == [0], "\n".join(result["errors"].values())
    got = json.loads((tmp_path / "metrics.json").read_text())
    model = Qwen2ForCausalLM(MODEL)
    load_weights(model, load_file(str(tmp_path / "hf.safetensors")).items(), strict=True)
    metrics, grads = step_gradients(NativeTrainer(model, make_config(**CONFIG)), corrected_batch())
    want = dataclasses.asdict(metrics)
    assert 0 < want["rollout_capped_frac"] < 1
    for key in ("loss", "pg_loss", "clip_frac", "rollout_capped_frac", "tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    recorded = load_file(str(tmp_path / "grads.safetensors"))
    for name, full in hf_to_megatron(grads, MODEL):
        torch.testing.assert_close(recorded[f"grad.{name}"], full, rtol=1e-4, atol=1e-6, msg=name)
