NUM_GPUS = 0
"""The same seed in colocated, spatial and hybrid placement trains on the same
samples per step (the ledger proves it), and the run directory has everything."""

import json
import os

import pytest
import yaml

from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from grpo_tiny import overrides

MODES = ("colocated", "spatial", "hybrid")
STEPS = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for mode in MODES:
        run_dir = str(tmp_path_factory.mktemp(mode))
        job = prepare(None, overrides(f"placement.mode={mode}", f"run.steps={STEPS}"), run_dir, None)
        assert job.run() == 0
        out[mode] = run_dir
    return out


def test_same_samples_per_step_in_every_mode(runs):
    ledgers = {mode: read_entries(os.path.join(d, "ledger.jsonl")) for mode, d in runs.items()}
    reference = ledgers["colocated"]
    assert [e.step for e in reference] == list(range(STEPS))
    assert len(reference[0].sample_ids) == 8 * 4
    all_ids = [i for e in reference for i in e.sample_ids]
    assert len(set(all_ids)) == len(all_ids)
    for mode in ("spatial", "hybrid"):
        assert [e.sample_ids for e in ledgers[mode]] == [e.sample_ids for e in reference], mode
        # Same weights, per-sample seeds and batch-independent sampling: the same tokens, step after step.
        assert [e.digests for e in ledgers[mode]] == [e.digests for e in reference], mode


def test_rewards_agree_across_modes(runs):
    rewards = {mode: [json.loads(line)["reward_mean"] for line in open(os.path.join(d, "metrics.jsonl"))]
               for mode, d in runs.items()}
    # Same tokens give the same rewards; the trainer's batch is canonical (experience.train_batch),
    # so the same weights follow and later steps agree too.
    assert rewards["spatial"] == rewards["colocated"] == rewards["hybrid"]


def test_run_directory_contents(runs):
    d = runs["spatial"]
    for name in ("config.yaml", "metrics.jsonl", "ledger.jsonl", "trace.json", "timeline.png",
                 "summary.json", "data_report.json"):
        assert os.path.isfile(os.path.join(d, name)), name
    config = yaml.safe_load(open(os.path.join(d, "config.yaml")))
    assert config["placement"]["mode"] == "spatial" and config["run"]["steps"] == STEPS
    rows = [json.loads(line) for line in open(os.path.join(d, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == list(range(STEPS))
    for key in ("reward_mean", "response_len_mean", "response_len_max", "tokens_per_s", "step_time_s",
                "rollout_s", "reward_s", "inference_s", "trainer_s", "sync_s"):
        assert all(isinstance(r[key], (int, float)) for r in rows), key
    assert all(r["weight_version"] == r["step"] for r in rows)  # every sample came from the current policy
    trace = json.load(open(os.path.join(d, "trace.json")))
    names = {e["name"] for e in trace["traceEvents"]}
    # on-policy, one update a batch: the trainer's forward gives the old log-probs (old_logprobs.py)
    assert {"generate step 0", "score step 0", "train step 0"} <= names and "compute_logprobs step 0" not in names
    # shared devices: the trainer gets them only after the rollout let go
    colocated = json.load(open(os.path.join(runs["colocated"], "trace.json")))["traceEvents"]
    for step in range(STEPS):
        generate, = [e for e in colocated if e["name"] == f"generate step {step}"]
        train, = [e for e in colocated if e["name"] == f"train step {step}"]
        assert train["ts"] >= generate["ts"] + generate["dur"] - 1  # (microseconds; float rounding)
    checkpoints = sorted(os.listdir(os.path.join(d, "checkpoints")))
    assert checkpoints == ["step_000000", f"step_{STEPS:06d}"]
