NUM_GPUS = 0
"""The agentic workflow with overlapped steps (algorithm.max_staleness 1): the next
step's episodes play on the weights of step s while step s's episodes, played during
step s - 1, are scored by inference and trained (components/workflows/overlap.py).
Every episode is trained once, one version after the weights that played it, its
observation tokens still out of the loss; the episodes' counters are those of the
trained step's episodes; the episodes played ahead survive a resume."""

import json
import os
import shutil

import yaml

from conftest import assert_reaped
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from test_agentic_train import ARGS, PROMPTS, SAMPLES

ASYNC = [a for a in ARGS if not a.startswith(("runtime.cluster.devices_per_node", "run.steps"))] + [
    "runtime.cluster.devices_per_node=4", "placement.mode=spatial", "algorithm.max_staleness=1"]


def _pairs(args):
    return [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in args)]


def _pids(job):
    w = job.workflow
    return [p for group in (w.g.rollout, w.g.inference, w.g.trainer, w.tools) for p in group.pids]


def test_agentic_steps_overlap_and_train_every_episode_once_one_version_behind(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, _pairs(ASYNC + ["run.steps=3", "run.checkpoint_every=1"]), run_dir, None)
    assert job.run() == 0
    pids = _pids(job)
    assert len(pids) == 5 and all(pids)
    # step 2's episodes were played during step 1: its checkpoint keeps them. Resume from
    # there, as if the run had died before step 3's checkpoint: they are trained as played
    checkpoints = os.path.join(run_dir, "checkpoints")
    assert os.path.exists(os.path.join(checkpoints, "step_000002", "ahead.json"))
    shutil.rmtree(os.path.join(checkpoints, "step_000003"))
    resumed = prepare(None, [("run.steps", 4)], None, run_dir)
    assert resumed.run() == 0
    pids += _pids(resumed)
    assert_reaped(pids)

    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1, 2, 3]
    for e in entries:
        expected = {f"calc-{p}/{k}" for p in range(e.step * PROMPTS, (e.step + 1) * PROMPTS) for k in range(SAMPLES)}
        assert len(e.sample_ids) == len(expected) and set(e.sample_ids) == expected
        # step 0 plays its own episodes; every other step trains those played during the step before
        assert set(e.versions) == {max(e.step - 1, 0)}
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    rows = {r["step"]: r for r in rows}  # (the resumed run writes step 2 again)
    assert sorted(rows) == [0, 1, 2, 3]
    assert [rows[s]["staleness_max"] for s in range(4)] == [0, 1, 1, 1]
    for r in rows.values():  # the trained episodes' counters
        assert r["episodes"] == PROMPTS * SAMPLES and r["episodes"] <= r["turns"] <= 3 * r["episodes"]
        assert sum(r["route_reasons"].values()) == r["turns"] and r["tool_calls"] <= r["turns"]
        assert r["weight_version"] == max(r["step"] - 1, 0)  # the oldest weights trained
