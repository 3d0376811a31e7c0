NUM_GPUS = 0
"""Checkpoint manifests and the decisions over them (components/workflows/checkpoints.py,
manifest.py): which checkpoint a resume starts from, what pruning removes, and how a
changed byte, a cut, a missing file or a short ledger copy is named."""

import json
import os

import pytest

from dynarl.components.workflows import checkpoints as ckpt
from dynarl.components.workflows import manifest
from dynarl.components.workflows.checkpoints import Found


def found(step, status="sealed"):
    return Found(f"/run/checkpoints/step_{step:06d}", step, status)


def bad(*steps):
    """A `problem` that fails the checkpoints of `steps`, and records what it was asked."""
    asked = []

    def problem(f):
        asked.append(f.step)
        return f"corrupt {f.step}" if f.step in steps else None
    problem.asked = asked
    return problem


@pytest.mark.parametrize("listing, failing, chosen, rejected, asked", [
    pytest.param([found(4), found(8)], (), 8, [], [8], id="newest_verifies_older_not_read"),
    pytest.param([found(4), found(8)], (8,), 4, [8], [8, 4], id="newest_corrupt_previous_used"),
    pytest.param([found(4), found(8), found(12)], (12, 8), 4, [12, 8], [12, 8, 4], id="two_corrupt"),
    pytest.param([found(4), found(8)], (8, 4), None, [8, 4], [8, 4], id="none_verifies"),
    pytest.param([found(4), found(8, "unsealed")], (), 4, [8], [4], id="cut_before_manifest_passed_over"),
    pytest.param([found(4, "unsealed"), found(8, "unsealed")], (), 8, [], [8], id="old_run_unverified"),
    pytest.param([found(4, "unsealed"), found(8)], (8,), 4, [8], [8, 4], id="corrupt_sealed_old_unsealed"),
    pytest.param([found(4), found(8, "incomplete")], (), 4, [], [4], id="incomplete_ignored"),
    pytest.param([], (), None, [], [], id="no_checkpoints"),
])
def test_choose_resume(listing, failing, chosen, rejected, asked):
    problem = bad(*failing)
    choice = ckpt.choose_resume(listing, problem)
    assert (choice.chosen.step if choice.chosen else None) == chosen
    assert [f.step for f, _ in choice.rejected] == rejected
    assert problem.asked == asked


@pytest.mark.parametrize("listing, keep, verified, removed", [
    pytest.param([found(0), found(4), found(8)], 2, 8, [0], id="keep_newest"),
    pytest.param([found(0), found(4), found(8)], 1, 4, [0], id="newest_verified_kept_beside_newer"),
    pytest.param([found(0), found(4, "unsealed"), found(8)], 1, 8, [0, 4], id="unsealed_counts_as_complete"),
    pytest.param([found(0), found(4, "incomplete"), found(8)], 2, 8, [4], id="incomplete_older_removed"),
    pytest.param([found(0), found(8), found(12, "incomplete")], 2, 8, [], id="incomplete_newer_kept"),
    pytest.param([found(0), found(4), found(8)], 2, None, [0], id="no_verified_given"),
])
def test_to_prune(listing, keep, verified, removed):
    verified = None if verified is None else found(verified).path
    assert ckpt.to_prune(listing, keep, verified) == [found(s).path for s in removed]


def write_checkpoint(run_dir, step, ledger_steps=None):
    path = ckpt.checkpoint_dir(run_dir, step)
    os.makedirs(os.path.join(path, "critic"), exist_ok=True)
    with open(os.path.join(path, "shard-00000-of-00001.safetensors"), "wb") as f:
        f.write(bytes(range(256)) * 64)
    with open(os.path.join(path, "critic", "meta.json"), "w") as f:
        json.dump({"step": step}, f)
    with open(os.path.join(path, ckpt.LEDGER_FILE), "w") as f:
        for s in range(step) if ledger_steps is None else ledger_steps:
            f.write(json.dumps({"step": s, "samples": [f"p{s}/0"], "digests": [0]}) + "\n")
    ckpt.write_state(path, ckpt.CheckpointState(step=step, trainer_step=step, seed=0, prompts_per_step=1))
    return path


def flip(file, offset=100, n=16):
    with open(file, "r+b") as f:
        f.seek(offset)
        data = f.read(n)
        f.seek(offset)
        f.write(bytes(b ^ 0xFF for b in data))


def test_a_sealed_checkpoint_verifies_and_names_what_changed(tmp_path):
    path = write_checkpoint(str(tmp_path), 3)
    assert ckpt.scan(str(tmp_path)) == [Found(path, 3, "sealed")]
    assert ckpt.problem(ckpt.scan(str(tmp_path))[0]) is None
    shard = os.path.join(path, "shard-00000-of-00001.safetensors")
    expected = manifest.record(shard)
    flip(shard)
    wrong = manifest.verify(path)
    assert wrong == (f"shard-00000-of-00001.safetensors: expected {expected.describe()}, "
                     f"found {manifest.record(shard).describe()}")
    assert expected.size == manifest.record(shard).size  # same size: only the checksum tells


@pytest.mark.parametrize("damage, says", [
    pytest.param(lambda p: os.truncate(os.path.join(p, "shard-00000-of-00001.safetensors"), 1000),
                 "shard-00000-of-00001.safetensors: expected 16384 bytes", id="truncated_shard"),
    pytest.param(lambda p: os.remove(os.path.join(p, "shard-00000-of-00001.safetensors")),
                 "shard-00000-of-00001.safetensors: expected 16384 bytes, crc32", id="deleted_shard"),
    pytest.param(lambda p: flip(os.path.join(p, "critic", "meta.json"), 2, 4), "critic/meta.json: expected",
                 id="nested_file"),
    pytest.param(lambda p: os.truncate(os.path.join(p, ckpt.LEDGER_FILE), 30), "ledger.jsonl: expected",
                 id="truncated_ledger"),
    pytest.param(lambda p: flip(os.path.join(p, ckpt.LEDGER_FILE), 10, 1), "ledger.jsonl: expected",
                 id="ledger_same_size"),
    pytest.param(lambda p: os.truncate(os.path.join(p, manifest.MANIFEST_FILE), 20), "manifest.json: unreadable",
                 id="truncated_manifest"),
])
def test_each_damage_is_named(tmp_path, damage, says):
    path = write_checkpoint(str(tmp_path), 3)
    damage(path)
    assert says in ckpt.problem(ckpt.scan(str(tmp_path))[0])
    if says.endswith("crc32"):
        assert "found no file" in ckpt.problem(ckpt.scan(str(tmp_path))[0])


def test_the_ledger_copy_must_hold_the_checkpoints_steps(tmp_path):
    """Checked without a manifest too (an old checkpoint): a short copy used to start
    every worker, then fail with DuplicateSample at the first step."""
    path = write_checkpoint(str(tmp_path), 3, ledger_steps=[0, 1])
    manifest.unseal(path)
    assert ckpt.problem(ckpt.scan(str(tmp_path))[0]) == "ledger.jsonl: expected steps 0..2, found steps 0..1"


def test_resume_falls_back_to_the_checkpoint_before_a_corrupt_one(tmp_path):
    run = str(tmp_path)
    older = write_checkpoint(run, 2)
    newer = write_checkpoint(run, 4)
    flip(os.path.join(newer, "shard-00000-of-00001.safetensors"))
    notes = []
    path, state = ckpt.resume_checkpoint(run, notes.append)
    assert (path, state.step) == (older, 2)
    assert len(notes) == 1 and notes[0].startswith(f"checkpoint {newer} not used: shard-00000-of-00001.safetensors: "
                                                   "expected 16384 bytes, crc32 ")
    assert notes[0].endswith("resuming from step_000002, the newest that verifies")
    flip(os.path.join(older, ckpt.LEDGER_FILE), 10, 1)
    with pytest.raises(ValueError, match="no checkpoint can be used: .*step_000004.*step_000002 not used: ledger"):
        ckpt.resume_checkpoint(run, notes.append)


def test_an_old_checkpoint_without_a_manifest_is_used_unverified_with_a_line(tmp_path):
    path = write_checkpoint(str(tmp_path), 2)
    manifest.unseal(path)
    notes = []
    assert ckpt.resume_checkpoint(str(tmp_path), notes.append)[0] == path
    assert notes == [f"checkpoint {path} has no manifest.json and none verifies (written before checkpoints had "
                     "one, or cut off before it): resuming from it unverified"]


def test_a_rewrite_is_incomplete_until_sealed_and_prune_keeps_the_verified(tmp_path):
    run = str(tmp_path)
    write_checkpoint(run, 0)
    four = write_checkpoint(run, 4)
    eight = write_checkpoint(run, 8)
    flip(os.path.join(eight, ckpt.STATE_FILE), 2, 1)  # a corrupt newer one from an earlier history
    ckpt.begin(four)  # a resumed run writes step 4 again
    assert [f.status for f in ckpt.scan(run)] == ["sealed", "incomplete", "sealed"]
    assert ckpt.latest_checkpoint(run)[1].step == 0
    write_checkpoint(run, 4)
    ckpt.prune(run, 1, verified=four)
    assert [f.step for f in ckpt.scan(run)] == [4, 8]  # 8 is the newest, 4 the newest verified
    assert ckpt.latest_checkpoint(run)[1].step == 4
