NUM_GPUS = 0
"""`dynarl train trainer.backend=megatron` end to end on CPU, against the native trainer
on the same config and seed: warm start, GRPO steps, weight sync to the native
rollout and inference engines, checkpoints. Same start weights and data, so rewards
and losses agree step by step. (Loading a megatron checkpoint: test_backend_megatron_state.py.)

The CPU run needs tests/megatron_cpu.py's CUDA shims in the trainer process; the test
puts tests/megatron_cpu_site on PYTHONPATH (a sitecustomize that applies them when
megatron is imported). Product code carries no shims."""
import json
import os
import pathlib
import subprocess
import sys
import uuid

import pytest

from dynarl.components.extras import is_available
from conftest import marked_processes
from grpo_tiny import TINY

pytestmark = pytest.mark.skipif(not is_available("megatron"),
                                reason="megatron-core not installed: pip install 'dynarl[megatron]'")

ROOT = pathlib.Path(__file__).resolve().parents[1]
MEGATRON = ["trainer.backend=megatron", "trainer.megatron={optimizer: adamw, dtype: float32, "
            "use_distributed_optimizer: false, use_cpu_initialization: true}"]


def _train(marker: str, run_dir: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DYNARL_TEST_MEGATRON_CPU="1", DYNARL_TEST_MARKER=marker)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "megatron_cpu_site"), *sys.path])
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, *args, "--run-dir", run_dir],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    marker = uuid.uuid4().hex
    base = tmp_path_factory.mktemp("train")
    out = {"native": str(base / "native"), "megatron": str(base / "megatron"), "tp2": str(base / "tp2")}
    native = _train(marker, out["native"], "run.steps=2")
    megatron = _train(marker, out["megatron"], "run.steps=2", *MEGATRON)
    # two trainer ranks as one TP group: both export the weights (a gather), rank 0 sends
    tp2 = _train(marker, out["tp2"], "run.steps=2", *MEGATRON, "trainer.num_ranks=2",
                 "trainer.megatron.tensor_parallel_size=2")
    for proc in (native, megatron, tp2):
        assert proc.returncode == 0, proc.stderr[-3000:]
    out["left_behind"] = marked_processes(marker)
    return out


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_every_process_is_reaped(runs):
    assert runs["left_behind"] == []


def test_the_megatron_trainer_ran_and_wrote_its_checkpoints(runs):
    checkpoints = pathlib.Path(runs["megatron"]) / "checkpoints"
    steps = []
    for step in ("step_000000", "step_000002"):  # after the warm start, at the end
        meta = json.loads((checkpoints / step / "megatron.json").read_text())
        assert meta["tensor_parallel_size"] == 1 and meta["world_size"] == 1
        steps.append(meta["step"])
    assert steps == [4, 6]  # 4 warm-start steps, then 2 GRPO steps
    assert not list((pathlib.Path(runs["native"]) / "checkpoints").glob("*/megatron.json"))
    assert [r["step"] for r in _rows(runs["megatron"])] == [0, 1]


def test_rewards_and_losses_match_the_native_trainer(runs):
    native, megatron = _rows(runs["native"]), _rows(runs["megatron"])
    assert len(native) == len(megatron) == 2
    for a, b in zip(native, megatron):
        assert a["reward_mean"] == b["reward_mean"]  # same samples: the weights agree to sampling precision
        for key in ("loss", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_tensor_parallel_2_trains_like_the_native_trainer(runs):
    native, tp2 = _rows(runs["native"]), _rows(runs["tp2"])
    assert [r["step"] for r in tp2] == [0, 1]
    meta = json.loads((pathlib.Path(runs["tp2"]) / "checkpoints" / "step_000002" / "megatron.json").read_text())
    assert meta["tensor_parallel_size"] == 2 and meta["world_size"] == 2
    for a, b in zip(native, tp2):
        # TP splits the matmuls (float32 sums in another order): after the warm start the
        # weights agree to ~1e-5, close enough that the seeded samples are the same
        assert a["reward_mean"] == b["reward_mean"]
        for key in ("loss", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-5), key


def _export(run_dir, out, step=2):
    done = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "export", run_dir, str(out), "--step", str(step)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"exported step {step} " in done.stdout
    return out


def test_megatron_checkpoints_export_to_hf_folders_that_transformers_loads(runs, tmp_path):
    """TP=1 and TP=2 checkpoints export (the TP slices joined, names converted) to the
    weights the native trainer reached on the same samples, and transformers' model of
    the export has dynarl's logits."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from dynarl.components.model.io import load_pretrained

    folders = {name: _export(runs[name], tmp_path / name) for name in ("native", "megatron", "tp2")}
    native = load_file(str(folders["native"] / "model.safetensors"))
    warm = load_file(str(_export(runs["megatron"], tmp_path / "warm", step=0) / "model.safetensors"))
    for name in ("megatron", "tp2"):
        weights = load_file(str(folders[name] / "model.safetensors"))
        assert set(weights) == set(native)
        for key, tensor in native.items():  # seen: max |diff| 1.8e-5 (TP=1), 7e-6 (TP=2) after 6 Adam steps
            torch.testing.assert_close(weights[key], tensor, rtol=0, atol=5e-5, msg=key)
    assert max((warm[k] - v).abs().max().item() for k, v in native.items()) > 1e-4  # the GRPO steps moved them
    theirs = AutoModelForCausalLM.from_pretrained(str(folders["tp2"]), torch_dtype=torch.float32).eval()
    ours = load_pretrained(folders["tp2"]).eval()
    ids = torch.randint(3, ours.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(input_ids=ids).logits, ours(ids), atol=1e-5, rtol=0)
