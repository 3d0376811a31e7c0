NUM_GPUS = 0
"""kill -9 of a training run mid-step, then --resume: it continues from the last
checkpoint, no sample is trained twice, and no worker outlives the controller."""

import json
import os
import subprocess
import sys

from dynarl.components.tasks.source import ProblemSource
from dynarl.components.workflows.config import load_config
from conftest import kill_9_mid_run
from grpo_tiny import TINY, overrides

STEPS, EVERY, N_PROMPTS, N_SAMPLES = 8, 3, 8, 4




def test_kill_9_mid_step_then_resume(tmp_path):
    run = str(tmp_path / "run")
    argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, f"run.steps={STEPS}",
            f"run.checkpoint_every={EVERY}", "run.keep_checkpoints=5", "run.log_samples=2", "--run-dir", run]
    killed_after = kill_9_mid_run(argv, run, EVERY + 1, tmp_path, workers=3)  # rollout, reward, trainer (no inference stage: old_logprobs.py)
    metrics = os.path.join(run, "metrics.jsonl")
    assert EVERY + 1 <= killed_after < STEPS

    result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    resumed_from = 3 * (killed_after // EVERY)
    assert f"resumed from {os.path.join(run, 'checkpoints', f'step_{resumed_from:06d}')}" in result.stdout

    ledger = [json.loads(line) for line in open(os.path.join(run, "ledger.jsonl"))]
    assert [e["step"] for e in ledger] == list(range(STEPS))
    ids = [i for e in ledger for i in e["samples"]]
    assert len(ids) == len(set(ids)) == STEPS * N_PROMPTS * N_SAMPLES  # exactly once
    cfg = load_config(None, overrides())
    source = ProblemSource(cfg.task, cfg.run.seed)
    for e in ledger:  # the data cursor resumed where the checkpoint left it
        expected = [f"{p.id}/{k}" for p in source.problems(e["step"] * N_PROMPTS, N_PROMPTS)
                    for k in range(N_SAMPLES)]
        assert e["samples"] == expected
    rolled_back = os.path.join(run, "ledger.rolled_back.jsonl")
    dropped = [json.loads(line)["step"] for line in open(rolled_back)] if os.path.exists(rolled_back) else []
    assert dropped == list(range(resumed_from, killed_after))  # trained into lost state: trained again once
    steps = [json.loads(line)["step"] for line in open(metrics)]
    assert steps == list(range(STEPS))
    for name in ("spans.jsonl", "samples_text.jsonl"):  # (the dashboard's) rolled back with metrics.jsonl
        assert [json.loads(line)["step"] for line in open(os.path.join(run, name))] == list(range(STEPS)), name
    assert os.path.isfile(os.path.join(run, f"trace-resume-{resumed_from}.json"))
