NUM_GPUS = 0

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def train(*args):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("example,placement", [
    ("examples/grpo_qwen2.5_7b_8xh100.yaml", "placement hybrid: rollout [0, 1, 2, 3], inference [4, 5, 6, 7]"),
    ("examples/grpo_qwen2.5_7b_slurm.yaml", "placement colocated"),
])
def test_cluster_examples_resolve_in_a_dry_run(example, placement):
    out = train(example, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "nothing started" in out.stdout and placement in out.stdout
    assert "rollout sglang, trainer megatron" in out.stdout
    assert "not read in a dry run" in out.stdout  # the cluster dataset path is not touched


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "examples").glob("*.yaml")))
def test_every_example_config_resolves_in_a_dry_run(example):
    out = train(f"examples/{example}", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "nothing started" in out.stdout


def test_the_dry_run_names_what_train_would_refuse():
    out = train("examples/grpo_qwen2.5_7b_8xh100.yaml", "--dry-run")  # dynarl with megatron's distributed optimizer
    assert out.returncode == 0 and "not trainable yet" not in out.stdout, out.stdout
    out = train("examples/grpo_qwen2.5_7b_8xh100.yaml", "rollout.backend=native", "runtime.cluster.device_kind=cpu",
                "--dry-run")
    assert "not trainable yet: trainer.megatron.optimizer" in out.stdout  # megatron's optimizer needs CUDA


def test_a_missing_extra_fails_at_config_load_naming_the_pip_command():
    out = train("rollout.backend=sglang", "run.steps=1")
    assert out.returncode == 2
    assert "rollout.backend" in out.stderr and "pip install 'dynarl[sglang]'" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_bad_backend_name_lists_the_choices():
    out = train("trainer.backend=deepspeed", "--dry-run")
    assert out.returncode == 2 and "trainer.backend" in out.stderr and "'megatron'" in out.stderr


def test_dry_run_still_rejects_an_impossible_layout():
    out = train("examples/grpo_qwen2.5_7b_8xh100.yaml", "trainer.megatron.tensor_parallel_size=3", "--dry-run")
    assert out.returncode == 2 and "trainer.megatron.tensor_parallel_size" in out.stderr
