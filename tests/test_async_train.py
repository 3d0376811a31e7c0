NUM_GPUS = 0
"""algorithm.max_staleness 1 in `dynarl train`: the next step's rollout runs while a
step trains (components/workflows/overlap.py). Every sample is trained once, one
version after the weights that generated it; the groups made ahead survive a kill -9
through the checkpoint; bad settings fail at load naming the field."""

import json
import os
import subprocess
import sys

import pytest

from dynarl import ConfigError
from dynarl.components.workflows.config import load_config
from dynarl.components.workflows.ledger import read_entries
from dynarl.launch.train import prepare
from conftest import assert_reaped, kill_9_mid_run
from grpo_tiny import TINY, overrides

ASYNC = ("placement.mode=spatial", "algorithm.max_staleness=1")
N_PROMPTS, N_SAMPLES = 8, 4


@pytest.mark.parametrize("extra, fragment", [
    (("algorithm.max_staleness=-1",), "must be an integer >= 0"),
    (("algorithm.max_staleness=1",), "devices of its own"),  # TINY's default placement is colocated
    (ASYNC + ("placement.mode=hybrid", "placement.pools=[[rollout, inference], [trainer]]"), "devices of its own"),
    (ASYNC + ("rollout.temperature=0.7",), "set rollout.temperature 1"),
])
def test_bad_async_settings_name_the_field(extra, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides(*extra))
    assert info.value.path == "algorithm.max_staleness"
    assert fragment in str(info.value)


def test_the_ppo_workflow_and_the_dynarl_scheduler_are_refused_with_async():
    with pytest.raises(ConfigError, match="on-policy") as info:
        load_config(None, overrides(*ASYNC, "workflow=ppo"))
    assert info.value.path == "algorithm.max_staleness"
    with pytest.raises(ConfigError, match="runs asynchronous steps as partial rollout") as info:
        load_config(None, overrides("runtime.cluster.devices_per_node=4", "rollout.num_ranks=2",
                                    "placement.mode=spatial", "scheduler.policy=dynarl", "algorithm.max_staleness=1",
                                    "rollout.oversample=1"))
    assert info.value.path == "algorithm.max_staleness"


@pytest.mark.parametrize("merged, oversample", [
    ({"scheduler": {"policy": "static"}, "algorithm": {"max_staleness": 0}}, 1.0),
    ({"scheduler": {"policy": "static"}, "algorithm": {"max_staleness": 2}}, 1.0),   # overlapped steps
    ({"scheduler": {"policy": "dynarl"}, "algorithm": {"max_staleness": 0}}, 1.0),   # on-policy
    ({"scheduler": {"policy": "dynarl"}, "algorithm": {"max_staleness": 2}}, 1.5),   # its async steps
    ({"scheduler": {"policy": "dynarl"}, "algorithm": {"max_staleness": "2"}}, 1.0),  # (left to the field's check)
    ({"scheduler": "dynarl", "algorithm": None}, 1.0),
])
def test_oversample_left_out_follows_the_scheduler(merged, oversample):
    from dynarl.components.workflows.config import default_oversample
    assert default_oversample(merged) == oversample


def test_the_dynarl_scheduler_at_k_2_runs_partial_rollout_unless_oversample_is_given():
    job = ("runtime.cluster.devices_per_node=4", "placement.mode=hybrid", "rollout.num_ranks=3",
           "scheduler.policy=dynarl", "algorithm.max_staleness=2")
    assert load_config(None, overrides(*job)).rollout.oversample == 1.5
    assert load_config(None, overrides(*job, "rollout.oversample=2")).rollout.oversample == 2.0
    assert load_config(None, overrides("algorithm.max_staleness=2", "placement.mode=spatial")).rollout.oversample == 1.0


def test_an_overlapped_run_trains_every_sample_once_one_version_behind(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides(*ASYNC, "run.steps=4"), run_dir, None)
    assert job.run() == 0
    w = job.workflow
    assert_reaped([p for group in (w.g.rollout, w.g.inference, w.g.trainer) for p in group.pids])
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [(r["staleness_max"], r["staleness_mean"]) for r in rows] == [(0, 0.0), (1, 1.0), (1, 1.0), (1, 1.0)]
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.step for e in entries] == [0, 1, 2, 3]
    for e in entries:  # the weights that generated each sample: step 0's own, then the step before's
        assert e.versions == (max(e.step - 1, 0),) * (N_PROMPTS * N_SAMPLES)
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == 4 * N_PROMPTS * N_SAMPLES




def test_at_k_2_the_rollout_runs_two_steps_ahead_and_every_sample_is_trained_once(tmp_path):
    run_dir = str(tmp_path / "run")
    job = prepare(None, overrides("placement.mode=spatial", "algorithm.max_staleness=2", "run.steps=4"), run_dir, None)
    assert job.run() == 0
    rows = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    # step 0 on-policy makes steps 1 and 2 on its weights; step 1 makes step 3 on its own
    assert [(r["staleness_max"], r["staleness_mean"]) for r in rows] == [(0, 0.0), (1, 1.0), (2, 2.0), (2, 2.0)]
    entries = read_entries(os.path.join(run_dir, "ledger.jsonl"))
    assert [e.versions[0] for e in entries] == [0, 0, 0, 1]
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == 4 * N_PROMPTS * N_SAMPLES


@pytest.mark.parametrize("made, step, depth, steps, expected", [
    ([], 0, 1, 5, [1]),
    ([], 0, 2, 5, [1, 2]),
    ([2], 1, 2, 5, [3]),        # step 2 made already
    ([3, 4], 2, 2, 5, []),      # the queue is full
    ([], 3, 2, 5, [4]),         # the run ends at step 4
    ([], 4, 3, 5, []),
])
def test_an_overlapped_step_makes_the_batches_up_to_its_depth(made, step, depth, steps, expected):
    from dynarl.components.workflows.overlap import Generated, MadeAhead
    source = MadeAhead(None, None, None, steps, lambda: 1, depth=depth)
    source.ahead = [Generated(s, [], [], []) for s in made]
    assert list(source.to_make(step)) == expected


def test_kill_9_mid_step_then_resume_trains_the_groups_made_ahead_once(tmp_path):
    """The checkpoint after step 2 holds step 3's groups, made on the weights of step 2:
    the resumed run trains those (staleness 1), not a regeneration on newer weights."""
    steps, every = 6, 3
    run = str(tmp_path / "run")
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, *ASYNC, f"run.steps={steps}",
            f"run.checkpoint_every={every}", "run.keep_checkpoints=5", "--run-dir", run]
    killed_after = kill_9_mid_run(argv, run, every + 1, tmp_path)
    assert every + 1 <= killed_after < steps
    checkpoint = os.path.join(run, "checkpoints", f"step_{every:06d}")
    assert [b["step"] for b in json.load(open(os.path.join(checkpoint, "ahead.json")))["batches"]] == [every]

    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert f"resumed from {checkpoint}" in result.stdout
    entries = read_entries(os.path.join(run, "ledger.jsonl"))
    assert [e.step for e in entries] == list(range(steps))
    ids = [i for e in entries for i in e.sample_ids]
    assert len(ids) == len(set(ids)) == steps * N_PROMPTS * N_SAMPLES  # every sample once, no step lost
    for e in entries:
        assert e.versions == (max(e.step - 1, 0),) * (N_PROMPTS * N_SAMPLES), e.step
    cfg = load_config(None, overrides(*ASYNC))
    from dynarl.components.tasks.source import ProblemSource
    source = ProblemSource(cfg.task, cfg.run.seed)
    for e in entries:  # the data stream in order: no step's batch skipped or repeated
        assert list(e.sample_ids) == [f"{p.id}/{k}" for p in source.problems(e.step * N_PROMPTS, N_PROMPTS)
                                      for k in range(N_SAMPLES)]


def test_the_async_bench_prints_both_runs_and_their_ratio():
    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "bench", "async", "--steps", "2", "--json",
                             "trainer.warmup.steps=2", "run.prompts_per_step=4", "rollout.samples_per_prompt=4",
                             "task.count_up.alphabet=abcdefghij", "task.count_up.median_len=2",
                             "rollout.max_new_tokens=12"],
                            capture_output=True, text=True, timeout=300)  # (a hang's bound: two short jobs)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout)  # the jobs' progress lines are not in it
    assert out["staleness0"]["staleness_max"] == 0 and out["staleness1"]["staleness_max"] == 1
    assert out["step_time_ratio"] == round(out["staleness0"]["step_s_mean"] / out["staleness1"]["step_s_mean"], 3)
    bad = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "bench", "async", "--steps", "2",
                          "algorithm.max_staleness=-1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "error: algorithm.max_staleness" in bad.stderr and "Traceback" not in bad.stderr
