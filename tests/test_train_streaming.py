NUM_GPUS = 0
"""`dynarl train trainer.streaming=true`: the trainer takes scored samples as inference
finishes them (a stage beside the others) and steps after the last. It trains the
same samples per step as the whole-batch step, and from the same weights the same
tokens (step 0); the step itself is equal up to float rounding (test_trainer_streaming)."""

import json
import os

import pytest

from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from grpo_tiny import overrides

STEPS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for streaming in (False, True):
        run_dir = str(tmp_path_factory.mktemp(f"streaming-{streaming}"))
        job = prepare(None, overrides("placement.mode=spatial", f"run.steps={STEPS}",
                                      f"trainer.streaming={str(streaming).lower()}"), run_dir, None)
        assert job.run() == 0
        out[streaming] = run_dir
    return out


def test_streaming_trains_the_same_samples_each_step_once(runs):
    whole, stream = (read_entries(os.path.join(runs[s], "ledger.jsonl")) for s in (False, True))
    assert [e.step for e in stream] == list(range(STEPS))
    assert [e.sample_ids for e in stream] == [e.sample_ids for e in whole]
    ids = [i for e in stream for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == STEPS * 8 * 4
    assert stream[0].digests == whole[0].digests  # the same weights sampled the same tokens


def test_streaming_metrics_and_timeline(runs):
    rows = [json.loads(line) for line in open(os.path.join(runs[True], "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(STEPS))
    reference = [json.loads(line) for line in open(os.path.join(runs[False], "metrics.jsonl"))]
    assert rows[0]["reward_mean"] == reference[0]["reward_mean"]
    assert rows[0]["loss"] == pytest.approx(reference[0]["loss"], rel=1e-4, abs=1e-6)
    assert all(r["trainer_s"] > 0 and r["samples"] == 32 for r in rows)
