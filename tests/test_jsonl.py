NUM_GPUS = 0
"""The run directory's JSON-lines files: whole records or nothing, a torn tail dropped,
a damaged line named."""

import os

import pytest

from dynarl.components.workflows import jsonl
from dynarl.components.workflows.jsonl import roll_back
from disk import fill, tmpfs


def test_records_round_trip_and_a_torn_last_line_is_not_one(tmp_path):
    path = str(tmp_path / "m.jsonl")
    assert jsonl.read(path) == []
    for step in range(3):
        jsonl.append(path, {"step": step}, sync=step == 2)
    with open(path, "a") as f:
        f.write('{"step": 3, "rew')  # a crash mid-append
    assert jsonl.read(path) == [{"step": 0}, {"step": 1}, {"step": 2}]


def test_a_damaged_line_before_the_tail_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
    with pytest.raises(jsonl.DamagedFile, match=r"m.jsonl:2: not a JSON record"):
        jsonl.read(str(path))


def test_resume_rolls_back_past_a_torn_tail(tmp_path):
    """The ledger after a crash mid-append: the steps after the checkpoint move to
    *.rolled_back.jsonl, the torn line goes, the file is whole again."""
    path = str(tmp_path / "ledger.jsonl")
    for step in range(4):
        jsonl.append(path, {"step": step, "samples": [f"p{step}"]})
    with open(path, "a") as f:
        f.write('{"step": 4, "samp')
    roll_back(path, 2)
    assert jsonl.read(path) == [{"step": 0, "samples": ["p0"]}, {"step": 1, "samples": ["p1"]}]
    assert open(path).read().endswith("\n")
    assert [r["step"] for r in jsonl.read(str(tmp_path / "ledger.rolled_back.jsonl"))] == [2, 3]


def test_an_append_to_a_full_disk_leaves_the_file_as_it_was(tmp_path):
    with tmpfs(tmp_path / "disk", size="256k") as disk:
        path = os.path.join(disk, "metrics.jsonl")
        jsonl.append(path, {"step": 0})
        before = open(path, "rb").read()
        filler = fill(disk)
        os.truncate(filler, os.path.getsize(filler) - 4096)  # room for part of the next record only
        with pytest.raises(OSError) as failed:
            jsonl.append(path, {"step": 1, "text": "y" * 20000}, sync=True)
        assert failed.value.errno == 28
        assert open(path, "rb").read() == before
        with pytest.raises(OSError):
            jsonl.rewrite(path, [{"step": 0, "text": "z" * 20000}])
        assert open(path, "rb").read() == before and not [n for n in os.listdir(disk) if n.endswith(".tmp")]
        os.remove(filler)
        jsonl.append(path, {"step": 1})
        assert jsonl.read(path) == [{"step": 0}, {"step": 1}]
