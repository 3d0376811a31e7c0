NUM_GPUS = 0
"""A resumed run's wall time is the sum of its segments' (the processes that trained
it), summary.json says so; steps are numbered from 0 alike on the console and in
metrics.jsonl; a run without a KL term prints no kl."""

import json
import os
import subprocess
import sys

import pytest

from dynarl.launch.run_segments import wall_times
from dynarl.launch.train import summarize


@pytest.mark.parametrize("records,times,now,walls", [
    pytest.param([{"start": 100, "step": 0}, {"end": 160}], [120, 150], None, [60], id="one"),
    pytest.param([{"start": 100, "step": 0}, {"end": 160}, {"start": 1000, "step": 5}, {"end": 1030}],
                 [120, 150, 1010, 1020], None, [60, 30], id="resumed"),
    pytest.param([{"start": 100, "step": 0}, {"start": 1000, "step": 3}, {"end": 1030}],
                 [120, 150, 1010], None, [50, 30], id="killed-then-resumed"),
    pytest.param([{"start": 100, "step": 0}, {"start": 1000, "step": 0}], [], None, [0, 0], id="killed-before-a-step"),
    pytest.param([{"start": 100, "step": 0}, {"end": 160}, {"start": 1000, "step": 5}], [120, 1010], 1042.0,
                 [60, 42], id="this-process-now"),
    pytest.param([{"start": 1000, "step": 5}, {"end": 1030}], [10, 20, 40, 1010], None, [30, 30],
                 id="steps-before-segments-were-kept"),
    pytest.param([{"start": 100, "step": 0}, {"end": 160}, {"end": 170}], [], None, [60], id="a-second-end-ignored"),
])
def test_the_segments_wall_times(records, times, now, walls):
    assert wall_times(records, times, now) == walls


def test_the_summary_sums_the_segments(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i, "reward_mean": 0.5, "tokens_per_s": 1.0, "step_time_s": 1.0})
                            + "\n" for i in range(4)))
    summary = summarize(str(path), [60.0, 30.0])
    assert (summary["wall_time_s"], summary["wall_time_segments_s"]) == (90.0, [60.0, 30.0])


def train(*args, cwd):
    return subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_a_resumed_run_counts_both_segments_and_numbers_steps_from_0(tmp_path):
    run = tmp_path / "run"
    common = ["run.prompts_per_step=4", "rollout.samples_per_prompt=4", "trainer.warmup.steps=2",
              "run.checkpoint_every=1"]
    first = train(*common, "run.steps=1", "--run-dir", str(run), cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    [line] = [x for x in first.stdout.splitlines() if x.startswith("step ")]
    assert line.startswith("step 0 (1/1)  reward") and " kl " not in line  # kl_coef 0: no KL term
    [row] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 0 and row["kl"] is None
    once = json.loads((run / "summary.json").read_text())
    assert len(once["wall_time_segments_s"]) == 1

    second = train("--resume", str(run), "run.steps=2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert [x[:14] for x in second.stdout.splitlines() if x.startswith("step ")] == ["step 1 (2/2)  "]
    summary = json.loads((run / "summary.json").read_text())
    first_s, second_s = summary["wall_time_segments_s"]
    assert summary["wall_time_s"] == pytest.approx(first_s + second_s)
    assert first_s == pytest.approx(once["wall_time_s"], abs=1.0) and second_s > 0
    assert "(2 segments: " in second.stdout
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert os.path.isfile(run / "segments.jsonl")
