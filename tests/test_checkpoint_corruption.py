NUM_GPUS = 0
"""Checkpoints a resume can trust (issue 50, item 1), on a real tiny run.

At 887f5f1 a same-size corruption of a trainer shard resumed silently (master
weights: a worse policy; exp_avg_sq: nan losses), other damage ended the run with a
remote traceback, and a nan step was checkpointed and pruned the last good
checkpoint away. Now every kind of damage names the file and the checkpoint before
it is used, and a step that is not finite stops the run before its checkpoint."""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest
import torch

from dynarl.components.workflows import checkpoints as ckpt
from grpo_tiny import TINY

SHARD = "__0_0.distcp"
"""The trainer's rank-0 data file (torch.distributed.checkpoint: weights and Adam moments)."""
RNG = "rng-00000.safetensors"
BASE_STEPS, EVERY = 4, 2


def train(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A finished 4-step run with checkpoints of steps 2 and 4 (keep 2, as in the issue)."""
    tmp = tmp_path_factory.mktemp("base")
    run = str(tmp / "run")
    result = train(*TINY, f"run.steps={BASE_STEPS}", f"run.checkpoint_every={EVERY}", "run.keep_checkpoints=2",
                   "--run-dir", run, cwd=tmp)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert [(f.step, f.status) for f in ckpt.scan(run)] == [(2, "sealed"), (4, "sealed")]
    return run


@pytest.fixture
def run_copy(base_run, tmp_path):
    run = str(tmp_path / "run")
    shutil.copytree(base_run, run)
    return run


def tensor_bytes(file, name):
    """(start, end) of tensor `name`'s bytes in a safetensors file."""
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    start, end = header[name]["data_offsets"]
    return 8 + header_len + start, 8 + header_len + end


def flip(file, start, n=4096):
    """n bytes changed in place: the file keeps its size."""
    with open(file, "r+b") as f:
        f.seek(start)
        data = f.read(n)
        f.seek(start)
        f.write(bytes(b ^ 0x5A for b in data))


def in_tensor(file_name, name):
    def damage(path):
        file = os.path.join(path, file_name)
        start, end = tensor_bytes(file, name)
        flip(file, start + (end - start) // 3, min(4096, end - start))
    return damage


def in_file(name, fraction):
    """4,096 bytes changed in place at `fraction` of the file (DCP's data file holds the
    weights first, then the optimizer's moments)."""
    def damage(path):
        file = os.path.join(path, name)
        flip(file, int(os.path.getsize(file) * fraction), 4096)
    return damage


DAMAGE = {
    "weights": (in_file(SHARD, 0.1), SHARD),
    "adam_moments": (in_file(SHARD, 0.8), SHARD),
    "dcp_metadata": (in_file(".metadata", 0.5), ".metadata"),
    "rng_state": (in_tensor(RNG, "rng_state"), RNG),
    "ledger_copy": (lambda p: flip(os.path.join(p, ckpt.LEDGER_FILE), 40, 8), ckpt.LEDGER_FILE),
    "meta_json": (lambda p: flip(os.path.join(p, "meta.json"), 20, 4), "meta.json"),
    "state_json": (lambda p: flip(os.path.join(p, ckpt.STATE_FILE), 2, 2), ckpt.STATE_FILE),
    "truncated_shard": (lambda p: os.truncate(os.path.join(p, SHARD), 4096), SHARD),
    "deleted_shard": (lambda p: os.remove(os.path.join(p, SHARD)), SHARD),
    "truncated_meta": (lambda p: os.truncate(os.path.join(p, "meta.json"), 30), "meta.json"),
    "truncated_ledger": (lambda p: os.truncate(os.path.join(p, ckpt.LEDGER_FILE), 100), ckpt.LEDGER_FILE),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_each_damage_is_named_and_the_checkpoint_before_it_used(run_copy, kind):
    damage, file = DAMAGE[kind]
    newest = ckpt.checkpoint_dir(run_copy, 4)
    damage(newest)
    notes = []
    path, state = ckpt.resume_checkpoint(run_copy, notes.append)
    assert (path, state.step) == (ckpt.checkpoint_dir(run_copy, 2), 2)
    assert len(notes) == 1
    assert notes[0].startswith(f"checkpoint {newest} not used: {file}: expected ")
    assert notes[0].endswith("resuming from step_000002, the newest that verifies")


def test_a_corrupt_newest_checkpoint_resumes_from_the_one_before(run_copy, tmp_path):
    """The issue's first probe: 4,096 bytes of the weights changed in place; the
    resume used to exit 0 from them. Now it says so in one line and trains steps 2..5
    again from step 2's checkpoint, each sample once."""
    newest = ckpt.checkpoint_dir(run_copy, 4)
    in_file(SHARD, 0.1)(newest)
    result = train("--resume", run_copy, "run.steps=5", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"checkpoint {newest} not used: {SHARD}: expected " in result.stderr
    assert f"resumed from {ckpt.checkpoint_dir(run_copy, 2)}: step 2" in result.stdout
    ledger = [json.loads(line) for line in open(os.path.join(run_copy, "ledger.jsonl"))]
    assert [e["step"] for e in ledger] == list(range(5))
    ids = [i for e in ledger for i in e["samples"]]
    assert len(ids) == len(set(ids))
    assert [f.step for f in ckpt.scan(run_copy)] == [4, 5]  # step 4 written again, then sealed
    assert ckpt.problem(ckpt.scan(run_copy)[0]) is None


def master(path):
    """The checkpoint's weights, read back as one vector."""
    from dynarl.launch.export import master_weights
    return torch.cat([t.reshape(-1) for _, t in master_weights(path)])


def test_a_nan_step_stops_the_run_with_the_last_good_checkpoint_intact(run_copy, tmp_path):
    """The issue's nan probe, without corruption: a learning rate of 1e30 makes step 4's
    update huge and step 5's loss nan. It used to go on, checkpoint nan weights at 6
    and 8 and prune 2 and 4 away; now it stops before step 6's checkpoint."""
    before = {f.step: open(os.path.join(f.path, ckpt.manifest.MANIFEST_FILE)).read() for f in ckpt.scan(run_copy)}
    result = train("--resume", run_copy, "run.steps=8", "trainer.engine.lr=1.0e+30", cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "dynarl train: failed: step 5 is not finite (loss nan, grad_norm nan): the run stopped before its " \
           "checkpoint" in result.stderr
    found = ckpt.scan(run_copy)
    assert [f.step for f in found] == [2, 4]  # nothing written, nothing pruned
    assert {f.step: open(os.path.join(f.path, ckpt.manifest.MANIFEST_FILE)).read() for f in found} == before
    assert all(ckpt.problem(f) is None for f in found)
    assert torch.isfinite(master(found[-1].path)).all()
    rows = [json.loads(line) for line in open(os.path.join(run_copy, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4, 5]  # the nan step's row is kept, for the record


def test_skip_goes_on_without_the_nan_batches_and_counts_them(run_copy, tmp_path):
    result = train("--resume", run_copy, "run.steps=8", "trainer.engine.lr=1.0e+30", "trainer.nonfinite=skip",
                   cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = [json.loads(line) for line in open(os.path.join(run_copy, "metrics.jsonl"))][4:]
    assert [r["skipped_batches"] for r in rows] == [0, 1, 1, 1]
    found = ckpt.scan(run_copy)
    assert [f.step for f in found] == [6, 8]
    assert all(ckpt.problem(f) is None for f in found)
    for f in found:  # the skipped updates were left out: huge weights from step 4, not nan
        assert torch.isfinite(master(f.path)).all()
