NUM_GPUS = 0
"""An agentic run resumes from its checkpoint: `dynarl train --resume DIR` with a
larger run.steps continues at the next step, the data cursor picks up where the
checkpoint left it (every episode of every step trained exactly once), the weight
version carries on, and no worker outlives either run."""

import json
import os

import yaml

from conftest import assert_reaped
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from test_agentic_train import ARGS, PROMPTS, SAMPLES


def _pids(job):
    w = job.workflow
    return [p for group in (w.g.rollout, w.g.inference, w.g.trainer, w.tools) for p in group.pids]


def test_agentic_run_resumes_from_its_checkpoint(tmp_path):
    run_dir = str(tmp_path / "run")
    first = [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in ARGS)]
    first = [(k, v) for k, v in first if k != "run.steps"] + [("run.steps", 2), ("run.checkpoint_every", 1)]
    job = prepare(None, first, run_dir, None)
    assert job.run() == 0
    pids = _pids(job)
    assert len(pids) == 5  # rollout 2, inference, trainer, tools (episodes are scored by the controller)
    assert job.workflow.g.reward is None
    assert os.path.isdir(os.path.join(run_dir, "checkpoints", "step_000002"))

    resumed = prepare(None, [("run.steps", 3)], None, run_dir)
    assert resumed.run() == 0
    assert len(_pids(resumed)) == 5
    pids += _pids(resumed)

    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1, 2]
    for e in entries:
        expected = {f"calc-{p}/{k}" for p in range(e.step * PROMPTS, (e.step + 1) * PROMPTS) for k in range(SAMPLES)}
        assert set(e.sample_ids) == expected and len(e.sample_ids) == len(expected)
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert [r["weight_version"] for r in rows] == [0, 1, 2]
    assert all(pids)
    assert_reaped(pids)
