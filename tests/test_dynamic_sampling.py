"""DAPO's dynamic sampling (algorithm.dynamic_sampling): the pure decision on each scored
group (components/workflows/dynamic_sampling.py), and `dynarl train` with it (refill.py):
no group whose rewards are all equal is trained, each drop and refill is counted, every
sample trained once, the prompt stream's position kept across a checkpoint."""
from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from dynarl import ConfigError
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.dynamic_sampling import Tally, decide, informative
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import UsageError, prepare
from conftest import assert_reaped
from grpo_tiny import overrides


@pytest.mark.parametrize("rewards, differ", [
    pytest.param([1, 0], True, id="mixed"),
    pytest.param([1, 1], False, id="all-right"),
    pytest.param([0, 0, 0], False, id="all-wrong"),
    pytest.param([0.5, 0.5, 1], True, id="partial-credit"),
    pytest.param([1], False, id="group-of-one"),
    pytest.param([], False, id="empty"),
    pytest.param([0.0, -0.0], False, id="signed-zeros-are-equal"),
])
def test_a_group_is_informative_when_its_rewards_differ(rewards, differ):
    assert informative(rewards) is differ


def test_an_unscored_group_is_refused():
    with pytest.raises(ValueError, match="no reward"):
        informative([1.0, None])


SAME, DIFF = [1, 1], [0, 1]


@pytest.mark.parametrize("need, budget, groups, kept, dropped, refills, ends_after", [
    # each group's fate in order; ends_after: groups decided when refilling stops (the rollout's ENDs go in)
    pytest.param(2, 4, [DIFF, DIFF], [1, 1], 0, [0, 0], 2, id="all-informative"),
    pytest.param(2, 4, [SAME, DIFF, DIFF], [0, 1, 1], 1, [1, 0, 0], 3, id="one-drop-one-refill"),
    pytest.param(2, 1, [SAME, SAME, DIFF], [0, 0, 1], 2, [1, 0, 0], 1, id="budget-spent-batch-short"),
    pytest.param(2, 0, [SAME, DIFF], [0, 1], 1, [0, 0], 0, id="no-budget-no-refill"),
    pytest.param(1, 3, [SAME, SAME, SAME, SAME], [0, 0, 0, 0], 4, [1, 1, 1, 0], 3, id="nothing-differs"),
    pytest.param(3, 9, [DIFF, SAME, SAME, DIFF, DIFF], [1, 0, 0, 1, 1], 2, [0, 1, 1, 0, 0], 5, id="refills-in-flight"),
])
def test_each_scored_group_is_kept_or_dropped_and_refilled(need, budget, groups, kept, dropped, refills, ends_after):
    tally = Tally(need=need, budget=budget, outstanding=need)
    got_kept, got_refills, ended = [], [], 0 if not tally.refilling else None
    for i, rewards in enumerate(groups):
        assert not tally.closed
        tally, verdict = decide(tally, rewards)
        got_kept.append(int(verdict.keep))
        got_refills.append(int(verdict.refill))
        assert tally.kept + tally.outstanding <= need  # never more in the batch than it wants
        if ended is None and not tally.refilling:
            ended = i + 1
    assert tally.closed  # every group sent was decided
    assert (got_kept, tally.dropped, got_refills, ended) == (kept, dropped, refills, ends_after)
    assert tally.refilled == sum(refills) <= budget
    assert tally.kept + tally.dropped == need + tally.refilled  # nothing unaccounted for


def test_deciding_with_nothing_outstanding_is_an_error():
    with pytest.raises(ValueError, match="outstanding"):
        decide(Tally(need=1, budget=0, outstanding=0), DIFF)


@pytest.mark.parametrize("extra, field, fragment", [
    (["algorithm.dynamic_sampling=true", "workflow=ppo"], "algorithm.dynamic_sampling", "workflow ppo"),
    (["algorithm.dynamic_sampling=true", "task.verifier=none"], "algorithm.dynamic_sampling", "reward 0"),
    (["algorithm.dynamic_sampling=true", "algorithm.max_staleness=1", "placement.mode=spatial"],
     "algorithm.dynamic_sampling", "overlapped"),
    (["algorithm.dynamic_sampling=true", "scheduler.policy=dynarl"], "algorithm.dynamic_sampling", "static"),
    (["algorithm.max_refills=3"], "algorithm.max_refills", "dynamic_sampling true"),
    (["algorithm.dynamic_sampling=true", "algorithm.max_refills=-1"], "algorithm.max_refills", ">= 0"),
])
def test_bad_dynamic_sampling_settings_name_the_field(extra, field, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        load_config(None, overrides(*extra))
    assert err.value.path == field


def test_the_refill_budget_defaults_to_twice_the_batch():
    cfg = load_config(None, overrides("algorithm.dynamic_sampling=true"))
    assert cfg.algorithm.refills(cfg.run.prompts_per_step) == 2 * cfg.run.prompts_per_step
    cfg = load_config(None, overrides("algorithm.dynamic_sampling=true", "algorithm.max_refills=3"))
    assert cfg.algorithm.refills(cfg.run.prompts_per_step) == 3


DYNAMIC = ("algorithm.dynamic_sampling=true", "run.save_samples=true", "rollout.chunk_size=4")
"""(A chunk of 4 groups: a rank must not hold a finished group back waiting for more while
its refill waits on that group.)"""
N, G = 8, 4  # grpo_tiny's prompts per step and samples per prompt


def trained_groups(run_dir: str) -> list[list[dict]]:
    """Each step's trained groups (samples.jsonl), by prompt."""
    steps = []
    for line in open(os.path.join(run_dir, "samples.jsonl")):
        by_prompt = defaultdict(list)
        for s in json.loads(line)["samples"]:
            by_prompt[s["id"].rsplit("/", 1)[0]].append(s)
        steps.append(list(by_prompt.values()))
    return steps


def test_a_dynamic_sampling_run_trains_no_group_whose_rewards_are_equal_and_counts_each_refill(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides(*DYNAMIC, "run.steps=3"), run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in w.worker_groups() for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert sum(r["dynamic_dropped_groups"] for r in rows) > 0  # the tiny policy makes equal groups: the path ran
    for r, groups in zip(rows, trained_groups(run_dir), strict=True):
        assert r["dynamic_uninformative"] == 0
        assert all(len({s["reward"] for s in g}) > 1 for g in groups)  # none trained with equal rewards
        assert len(groups) == N - r["dynamic_short_groups"] and r["samples"] == len(groups) * G
        assert r["dynamic_refilled_groups"] <= min(r["dynamic_dropped_groups"], 2 * N)
        # every group generated was kept or dropped: the N first and each refill
        assert len(groups) + r["dynamic_dropped_groups"] == N + r["dynamic_refilled_groups"]
        assert r["batch_reward_mean"] == pytest.approx(sum(s["reward"] for g in groups for s in g) / r["samples"])
    ids = [i for e in read_entries(os.path.join(run_dir, "ledger.jsonl")) for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == sum(r["samples"] for r in rows)  # every sample once


def test_the_stream_position_survives_a_checkpoint_and_needs_dynamic_sampling_to_resume(tmp_path):
    run = str(tmp_path / "run")
    job = prepare(None, overrides(*DYNAMIC, "run.steps=2", "run.checkpoint_every=1"), run, None)
    assert job.run() == 0
    kept = json.load(open(os.path.join(run, "checkpoints", "step_000002", "partial.json")))
    assert kept["source"] == "dynamic" and kept["stream"] != [2, 0]  # refills ran the stream ahead
    with pytest.raises(UsageError, match="algorithm.dynamic_sampling true"):
        prepare(None, [("algorithm.dynamic_sampling", False), ("run.steps", 3)], None, run)
    resumed = prepare(None, [("run.steps", 3)], None, run)
    assert resumed.run() == 0
    ids = [i for e in read_entries(os.path.join(run, "ledger.jsonl")) for i in e.sample_ids]
    assert len(ids) == len(set(ids))  # the resumed step took new prompts, none trained twice
