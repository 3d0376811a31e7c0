NUM_GPUS = 0
"""`dynarl train` with workflow agentic, end to end on CPU: every episode of every
step is trained exactly once, tools are called, the metrics carry the episode
counters, and every worker process (tools included) is reaped.

The inproc launcher cannot host the weight-sync process group (TrainConfig
refuses it), so this runs the default local launcher with the smallest job."""

import json
import os

import pytest
import yaml

from conftest import assert_reaped
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare

STEPS, PROMPTS, SAMPLES = 2, 4, 4
ARGS = ["workflow=agentic", "task.kind=calc", "runtime.cluster.devices_per_node=2",
        "rollout.num_ranks=2", "inference.num_ranks=1", "trainer.num_ranks=1",
        f"rollout.samples_per_prompt={SAMPLES}", f"run.prompts_per_step={PROMPTS}", f"run.steps={STEPS}",
        "rollout.max_new_tokens=16", "trainer.warmup.steps=40", "trainer.warmup.batch_size=32",
        "trainer.warmup.lr=0.003", "task.calc.warmup_direct_frac=0", "trainer.engine.micro_batch_size=32",
        "agentic.queue=priority"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("agentic"))
    job = prepare(None, [(k, yaml.safe_load(v)) for k, _, v in (a.partition("=") for a in ARGS)], run_dir, None)
    assert job.run() == 0
    w = job.workflow
    pids = [p for group in (w.g.rollout, w.g.inference, w.g.trainer, w.tools) for p in group.pids]
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    return run_dir, rows, pids


def test_every_episode_is_trained_exactly_once(run):
    run_dir, rows, _ = run
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(STEPS))
    for e in entries:
        expected = {f"calc-{p}/{k}" for p in range(e.step * PROMPTS, (e.step + 1) * PROMPTS) for k in range(SAMPLES)}
        assert len(e.sample_ids) == len(expected) and set(e.sample_ids) == expected
    assert [r["samples"] for r in rows] == [PROMPTS * SAMPLES] * STEPS


def test_metrics_carry_the_episode_counters(run):
    _, rows, _ = run
    for r in rows:
        for key in ("reward_mean", "tool_calls", "tool_call_rate", "turns", "turns_mean", "malformed_calls",
                    "reprefill_tokens", "cached_tokens", "max_wait_s", "answered_frac"):
            assert isinstance(r[key], (int, float)), key
        assert r["weight_version"] == r["step"]
        assert r["episodes"] <= r["turns"] <= r["episodes"] * 3  # at least one turn each, at most the cap
        assert 0 <= r["tool_call_rate"] <= 1 and r["tool_calls"] <= r["turns"]
        assert sum(r["route_reasons"].values()) == r["turns"]
    # the warm start taught the format: the model calls the calculator
    assert sum(r["tool_calls"] for r in rows) > 0
    # follow-up turns of priority + affinity go back to the engine that has their prefix
    assert sum(r["route_reasons"].get("affinity", 0) for r in rows) > 0


def test_workers_are_reaped(run):
    _, _, pids = run
    assert len(pids) == 5 and all(pids)
    assert_reaped(pids)
