NUM_GPUS = 0
"""The run directory's disk fills up mid-run: a clear one-line error naming the disk
and how to go on, no worker left behind, and `--resume` once space is freed trains
every step exactly once (even past a torn ledger tail). A read-only run directory:
a clear error, no traceback."""

import json
import os
import subprocess
import sys
import time

from disk import fill, tmpfs
from grpo_tiny import TINY
from conftest import children, running

STEPS, EVERY, N_PROMPTS, N_SAMPLES = 6, 2, 8, 4


def test_disk_full_mid_run_then_resume_after_space_is_freed(tmp_path):
    with tmpfs(tmp_path / "disk") as disk:
        run = os.path.join(disk, "run")
        argv = [sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, f"run.steps={STEPS}",
                f"run.checkpoint_every={EVERY}", "--run-dir", run]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        metrics = os.path.join(run, "metrics.jsonl")
        deadline = time.monotonic() + 90
        while not (os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= EVERY + 1):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        workers = children(proc.pid)
        filler = fill(disk)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, out[-1000:] + err[-2000:]
        failed = [line for line in err.splitlines() if line.startswith("dynarl train: failed:")]
        assert len(failed) == 1, err[-2000:]
        assert f"no space left on device in {run}" in failed[0]
        assert f"dynarl train --resume {run}" in failed[0]
        assert "Traceback" not in err
        assert not [w for w in workers if running(w)], "workers outlived the failed run"

        os.remove(filler)
        with open(os.path.join(run, "ledger.jsonl"), "a") as f:
            f.write('{"step": 99, "samp')  # as a crash mid-append would leave it
        result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", "--resume", run],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        with open(os.path.join(run, "ledger.jsonl")) as f:
            ledger = [json.loads(line) for line in f]
        assert [e["step"] for e in ledger] == list(range(STEPS))
        ids = [i for e in ledger for i in e["samples"]]
        assert len(ids) == len(set(ids)) == STEPS * N_PROMPTS * N_SAMPLES
        with open(metrics) as f:
            assert [json.loads(line)["step"] for line in f] == list(range(STEPS))


def test_a_read_only_run_directory_is_a_clear_error(tmp_path):
    with tmpfs(tmp_path / "ro", size="1m", read_only=True) as disk:
        run = os.path.join(disk, "run")
        result = subprocess.run([sys.executable, "-m", "dynarl.launch.cli", "train", *TINY, "--run-dir", run],
                                capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert result.returncode == 1
        assert result.stderr.strip() == f"dynarl train: failed: cannot write the run directory {run}: " \
                                        "Read-only file system"
